"""course_lib: the finished code of the GPT-2-from-scratch course, one module per notebook.

Each module mirrors the `#| export` cells of one notebook (the map: docs/design.md, section 1); import from the modules,
e.g. `from course_lib.tokenization import gpt2_tokenizer`. Importing the package imports no module: each class is
complete where its notebook defines it (`from course_lib.model import GPTModel` gives the model every notebook runs).
"""
