"""course_lib: the finished code of the GPT-2-from-scratch course, one module per notebook.

Each module mirrors the `#| export` cells of one notebook (see README.md); import from the modules,
e.g. `from course_lib.tokenization import gpt2_tokenizer`.
"""
