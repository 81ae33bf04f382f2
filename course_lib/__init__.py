"""course_lib: the finished code of the GPT-2-from-scratch course, one module per notebook.

Each module mirrors the `#| export` cells of one notebook (the map: docs/design.md, section 1); import from the modules,
e.g. `from course_lib.tokenization import gpt2_tokenizer`.

A later notebook may add to a class of an earlier one where it teaches the addition (nbdev's `@patch`):
notebook 08 gives `GPTModel.forward` KV caches and `last_only`, notebook 11 a padding mask. Importing those
modules here makes every `GPTModel` complete, whichever module it is imported from.
"""

from . import decoding, generation  # noqa: F401  (for their @patch additions to GPTModel)
