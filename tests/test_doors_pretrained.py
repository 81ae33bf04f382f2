"""Issue 30: every public door of course_lib.pretrained, called the way a user who has not read the code might.
One table of cases: ("error", type, fragment of our message naming the argument) or ("result", check).
`python tests/test_doors_pretrained.py` prints the counts of clear errors, correct results, unclear errors and
silent wrong answers."""

import json
import math
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from course_lib.config import GPTConfig
from course_lib.model import GPTModel
from course_lib.pretrained import (
    config_from_hf, copy_from_hf, download_gpt2, expand_name_map, fill_from_hf, folder_files, gpt2_files,
    hf_config_from, hf_shapes, hf_state_from, hub_reachable, load_gpt2, load_shakespeare_gpt, plain_hf_state, save_gpt2,
)

from doors import door_tests, report

CFG = GPTConfig(vocab_size=16, context_length=8, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0)


def model(**changes):
    torch.manual_seed(0)
    return GPTModel(GPTConfig(**{**CFG.__dict__, **changes}))


def tmp():
    return Path(tempfile.mkdtemp())


def saved_dir(m=None):
    return save_gpt2(m or model(), tmp() / "gpt")


def round_trip():
    m = model()
    loaded = load_gpt2(saved_dir(m), "cpu")
    ids = torch.tensor([[1, 2, 3]])
    return torch.allclose(m.eval()(ids), loaded(ids))


def with_weights(change):
    "A saved directory whose model.safetensors went through change(state)."
    d = saved_dir()
    state = load_file(d / "model.safetensors")
    change(state)
    save_file(state, d / "model.safetensors")
    return d


def with_config(text):
    d = saved_dir()
    (d / "config.json").write_text(text)
    return d


def nan_weight(state):
    state["transformer.h.0.mlp.c_fc.weight"][0, 0] = math.nan


def fill_untouched(hf_state, m=None):
    m = m or model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    try:
        return fill_from_hf(m, hf_state)
    finally:
        assert all(torch.equal(before[k], v) for k, v in m.state_dict().items()), "a refused fill changed the model"


HF = hf_state_from(model())

CASES = [
    # expand_name_map
    ("names ok", lambda: len(expand_name_map(2)), "result", lambda r: r == 4 + 2 * 16),
    ("names -1", lambda: expand_name_map(-1), "error", ValueError, "n_layers"),
    ("names 2.0", lambda: expand_name_map(2.0), "error", TypeError, "n_layers"),
    ("names '2'", lambda: expand_name_map("2"), "error", TypeError, "n_layers"),
    # config_from_hf
    ("cfg ok", lambda: config_from_hf(hf_config_from(CFG)), "result", lambda r: r == CFG),
    ("cfg list", lambda: config_from_hf([("n_embd", 16)]), "error", TypeError, "hf_config"),
    ("cfg str", lambda: config_from_hf('{"n_embd": 16}'), "error", TypeError, "hf_config"),
    ("cfg n_embd str", lambda: config_from_hf({"n_embd": "768"}), "error", ValueError, "emb_dim"),
    ("cfg llama", lambda: config_from_hf({"model_type": "llama"}), "error", ValueError, "model_type"),
    ("cfg gelu", lambda: config_from_hf({"activation_function": "relu"}), "error", ValueError, "activation_function"),
    ("cfg eps", lambda: config_from_hf({"layer_norm_epsilon": 1e-6}), "error", ValueError, "layer_norm_epsilon"),
    ("cfg tie str", lambda: config_from_hf({"tie_word_embeddings": "true"}), "error", ValueError, "tie_weights"),
    # plain_hf_state / hf_shapes / copy_from_hf
    ("plain ok", lambda: sorted(plain_hf_state({"transformer.wte.weight": 1, "h.0.attn.bias": 2})), "result",
     lambda r: r == ["wte.weight"]),
    ("plain twice", lambda: plain_hf_state({"transformer.wte.weight": 1, "wte.weight": 2}), "error", ValueError,
     "stored twice"),
    ("plain list", lambda: plain_hf_state([("wte.weight", 1)]), "error", TypeError, "hf_state"),
    ("shapes ok", lambda: hf_shapes(dict(model().named_parameters()), expand_name_map(2), True)["wte.weight"],
     "result", lambda r: r == (16, 16)),
    ("copy ok", lambda: copy_from_hf(dict(model().named_parameters()), plain_hf_state(HF), expand_name_map(2), True),
     "result", lambda r: r is None),
    # fill_from_hf
    ("fill ok", lambda: fill_from_hf(model(), HF), "result", lambda r: r is None),
    ("fill model str", lambda: fill_from_hf("gpt2", HF), "error", TypeError, "model"),
    ("fill state list", lambda: fill_untouched(list(HF.items())), "error", TypeError, "hf_state"),
    ("fill missing key", lambda: fill_untouched({k: v for k, v in HF.items() if "ln_f" not in k}), "error",
     ValueError, "missing key"),
    ("fill extra key", lambda: fill_untouched({**HF, "extra.weight": torch.zeros(1)}), "error", ValueError,
     "unexpected key"),
    ("fill int tensor", lambda: fill_untouched({**HF, "transformer.wte.weight": HF["transformer.wte.weight"].long()}),
     "error", ValueError, "floating-point"),
    ("fill ndarray", lambda: fill_untouched({**HF, "transformer.wte.weight": HF["transformer.wte.weight"].numpy()}),
     "error", ValueError, "wte.weight"),
    ("fill nan", lambda: fill_untouched({**HF, "transformer.ln_f.weight": torch.full((16,), math.nan)}), "error",
     ValueError, "ln_f.weight"),
    ("fill no bias model", lambda: fill_untouched(HF, model(qkv_bias=False)), "error", ValueError, "qkv_bias"),
    ("fill bf16", lambda: fill_from_hf(model(), {k: v.bfloat16() for k, v in HF.items()}), "result",
     lambda r: r is None),
    ("fill meta", lambda: fill_untouched({k: v.to("meta") for k, v in HF.items()}), "error", ValueError, "meta"),
    # folder_files / gpt2_files / hub_reachable
    ("folder ok", lambda: [p.name for p in folder_files(saved_dir())[1]], "result",
     lambda r: r == ["model.safetensors"]),
    ("folder empty", lambda: folder_files(tmp()), "error", FileNotFoundError, "config.json"),
    ("folder str", lambda: folder_files(str(saved_dir())), "result", lambda r: r[0].name == "config.json"),
    ("folder bad index", lambda: folder_files(bad_index()), "error", ValueError, "safetensors index"),
    ("files none", lambda: gpt2_files(None), "error", TypeError, "path_or_name"),
    ("files unknown", lambda: gpt2_files("gpt-5"), "error", ValueError, "neither a directory"),
    ("download unknown", lambda: download_gpt2("gpt-5"), "error", ValueError, "name must be one of gpt2"),
    ("download path", lambda: download_gpt2(saved_dir()), "error", ValueError, "load_gpt2(folder)"),
    ("hub bool", lambda: hub_reachable() in (True, False), "result", lambda r: r),
    # load_gpt2
    ("load ok", round_trip, "result", lambda r: r),
    ("load bad device", lambda: load_gpt2(saved_dir(), "gpu"), "error", ValueError, "device"),
    ("load config not json", lambda: load_gpt2(with_config("{oops"), "cpu"), "error", ValueError, "not valid JSON"),
    ("load config list", lambda: load_gpt2(with_config("[]"), "cpu"), "error", TypeError, "config.json"),
    ("load config wrong size", lambda: load_gpt2(with_config(json.dumps({**hf_config_from(CFG), "n_layer": 3})),
                                                 "cpu"), "error", ValueError, "missing key"),
    ("load truncated weights", lambda: load_gpt2(truncated_weights(), "cpu"), "error", ValueError,
     "not a readable safetensors"),
    ("load nan weights", lambda: load_gpt2(with_weights(nan_weight), "cpu"), "error", ValueError, "c_fc.weight"),
    ("load meta", lambda: load_gpt2(saved_dir(), "meta"), "error", ValueError, "device 'meta'"),
    ("load meta device", lambda: load_gpt2(saved_dir(), torch.device("meta")), "error", ValueError, "'cpu'"),
    # hf_config_from / hf_state_from / save_gpt2
    ("hfcfg ok", lambda: hf_config_from(CFG)["n_embd"], "result", lambda r: r == 16),
    ("hfcfg dict", lambda: hf_config_from({"emb_dim": 16}), "error", TypeError, "cfg"),
    ("hfcfg dtype str", lambda: hf_config_from(CFG, "float32"), "error", TypeError, "dtype"),
    ("hfstate str", lambda: hf_state_from("gpt2"), "error", TypeError, "model"),
    ("hfstate no bias", lambda: hf_state_from(model(qkv_bias=False))["transformer.h.0.attn.c_attn.bias"].abs().sum(),
     "result", lambda r: r == 0),
    ("save str model", lambda: save_gpt2("gpt2", tmp()), "error", TypeError, "model"),
    ("save dir is file", lambda: save_gpt2(model(), a_file()), "error", FileExistsError, "x.txt"),
    ("save dir None", lambda: save_gpt2(model(), None), "error", TypeError, "directory"),
    ("save nan model", lambda: save_gpt2(nan_model(), tmp() / "gpt"), "error", ValueError, "finite"),
    ("save bf16 round trip", lambda: load_gpt2(saved_dir(model().bfloat16()), "cpu").embedding.tok_emb.weight.dtype,
     "result", lambda r: r == torch.float32),  # like from_pretrained without torch_dtype
    # load_shakespeare_gpt
    ("shakespeare ok", lambda: load_shakespeare_gpt("cpu")[1].vocab_size, "result", lambda r: r == 65),
    ("shakespeare device", lambda: load_shakespeare_gpt("gpu"), "error", ValueError, "device"),
]


def bad_index():
    d = saved_dir()
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text("[]")
    return d


def truncated_weights():
    d = saved_dir()
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    return d


def a_file():
    path = tmp() / "x.txt"
    path.write_text("x")
    return path


def nan_model():
    m = model()
    with torch.no_grad():
        m.final_norm.scale[0] = math.nan
    return m


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)
