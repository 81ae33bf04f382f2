"""Not a lesson: the doors of notebook 02 (course_lib/embeddings.py): the first position of the sinusoidal code.
GPTEmbedding checks nothing per call: GPTModel's door (doors/model.py) checks the token ids once, for every layer
behind it."""

from ..guards import require_int


def first_position(start_pos) -> None:
    """SinusoidalPositionalEmbedding.forward: a first position of at least 0 (a negative index would silently count
    from the end of the table; one past the table fails in the indexing itself)."""
    require_int("start_pos", start_pos, minimum=0)
