"""Not a lesson: the command line of notebook 13's course_lib.distributed.

    python -m course_lib.pretrain prepare DATA_DIR [--tokenizer gpt2|char] [--text FILE] [--text FILE2] ...
                                                             # no --text: the shipped Shakespeare
    python -m course_lib.pretrain train DATA_DIR OUT_DIR [--preset ...]              # one process
    torchrun --standalone --nproc_per_node=2 -m course_lib.pretrain train DATA_DIR OUT_DIR ...   # two
"""

from course_lib.distributed import main

if __name__ == "__main__":
    main()
