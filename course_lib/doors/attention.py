"""Not a lesson: the doors of notebook 05 (course_lib/attention.py): the weights copied into the readable wrapper and
the length a KV cache is cropped to. The attention layers check nothing per call: GPTConfig refuses impossible sizes
when it is built, and GPTModel's door (doors/model.py) checks the token ids once, for every layer behind it."""

from ..guards import require_int


def copy_fused_weights(fused, wrapper) -> None:
    """copy_fused_weights_to_wrapper: both layers with the same number of heads (otherwise the rows would still fit
    the shapes, split into the wrong heads), and every tensor of `fused` with a place of its shape in `wrapper`, and
    the other way round. Checked before anything is copied: load_state_dict would refuse a mismatch only after it
    had copied the tensors that fit."""
    if fused.n_heads != wrapper.n_heads:
        raise ValueError(f"fused has {fused.n_heads} heads, wrapper {wrapper.n_heads}: build both from one GPTConfig")
    given = {}  # wrapper's name -> the shape fused gives it, split into heads as the lesson splits it
    for name, tensor in fused.state_dict().items():
        shape = tuple(tensor.shape)
        if name.startswith("out_proj."):
            given[name] = shape
        else:
            for h, start in enumerate(range(0, shape[0], wrapper.head_dim)):  # the pieces of tensor.split(head_dim)
                given[f"heads.{h}.{name}"] = (min(wrapper.head_dim, shape[0] - start), *shape[1:])
    wanted = {name: tuple(tensor.shape) for name, tensor in wrapper.state_dict().items()}
    for name in sorted(given.keys() | wanted.keys()):
        if given.get(name) != wanted.get(name):
            raise ValueError(f"wrapper's {name} is {wanted.get(name, 'missing')}, fused gives it "
                             f"{given.get(name, 'nothing')}: build both from one GPTConfig")


def crop(length) -> None:
    """KVCache.crop: a whole number of positions to keep, at least 0 (a negative one would count from the end)."""
    require_int("length", length, minimum=0)
