"""load_gpt2 / save_gpt2 against Hugging Face's GPT-2, offline: random GPT2LMHeadModels saved to temporary
folders stand in for the real checkpoints, and every error the module raises is checked by its message."""

import json
import socket

import pytest
import torch
import transformers
from huggingface_hub.errors import LocalEntryNotFoundError
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

import course_lib.pretrained as pretrained
from course_lib.config import GPTConfig
from course_lib.generation import generate
from course_lib.model import GPTModel
from course_lib.tokenization import gpt2_tokenizer
from course_lib.pretrained import (config_from_hf, expand_name_map, fill_from_hf, hf_state_from, load_gpt2,
                                   save_gpt2)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# Two shapes. initializer_range 0.2 instead of GPT-2's 0.02 gives sharp next-token choices, so 20 greedy
# tokens vary (a std-0.02 model repeats one token) and a wrong mapping cannot hide behind a flat softmax.
SMALL = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=64, initializer_range=0.2)
OTHER = dict(n_embd=96, n_layer=3, n_head=6, vocab_size=517, n_positions=40, initializer_range=0.2)


def hf_model(seed: int = 0, **config) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**config)).eval()


@pytest.fixture(scope="module", params=[SMALL, OTHER], ids=["small", "other"])
def saved(request, tmp_path_factory):
    """A random Hugging Face GPT-2, and the directory save_pretrained wrote it to."""
    hf = hf_model(**request.param)
    directory = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(directory)
    return hf, directory


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    """The SMALL model saved by Hugging Face, for the tests of files and errors."""
    directory = tmp_path_factory.mktemp("small")
    hf_model(**SMALL).save_pretrained(directory)
    return directory


def prompt(vocab_size: int, tokens: int = 8) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, tokens), generator=torch.Generator().manual_seed(1))


def test_load_gpt2_gives_hugging_faces_logits(saved):
    hf, directory = saved
    model = load_gpt2(directory, device="cpu")
    assert isinstance(model, GPTModel) and not model.training
    assert model.out_head.weight is model.embedding.tok_emb.weight  # tied, like GPT-2
    assert model.cfg == GPTConfig(vocab_size=hf.config.vocab_size, context_length=hf.config.n_positions,
                                  emb_dim=hf.config.n_embd, n_heads=hf.config.n_head,
                                  n_layers=hf.config.n_layer, drop_rate=0.1, qkv_bias=True)
    ids = prompt(hf.config.vocab_size)
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits  # (2, 8, vocab_size)
    assert theirs.std() > 1  # sharp logits: a meaningful comparison
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_20_greedy_tokens_equal_hugging_faces_generate(saved):
    hf, directory = saved
    model = load_gpt2(directory, device="cpu")
    ids = prompt(hf.config.vocab_size)[:1]  # (1, 8)
    ours = generate(model, ids, max_new_tokens=20)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20,
                         pad_token_id=0, eos_token_id=None)
    assert ours.shape == (1, 28)
    assert torch.equal(ours, theirs)
    assert len(set(ours[0, 8:].tolist())) >= 5  # not one token repeated: the test can tell models apart


def test_save_gpt2_then_hugging_face_from_pretrained_gives_equal_logits(saved, tmp_path):
    hf, directory = saved
    model = load_gpt2(directory, device="cpu")
    save_gpt2(model, tmp_path / "ours")
    reloaded, info = GPT2LMHeadModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []
    ids = prompt(hf.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(ids).logits, model(ids), atol=1e-4, rtol=0)
    for key, value in hf.state_dict().items():  # every tensor survived the round trip exactly
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_untied_model_without_qkv_bias_round_trips_through_hugging_face(tmp_path):
    """A model like notebook 09's (separate head, no qkv bias) is saved as an untied GPT-2 with zero
    c_attn biases: Hugging Face and load_gpt2 both compute the same logits from it."""
    torch.manual_seed(3)
    cfg = GPTConfig(vocab_size=300, context_length=16, emb_dim=32, n_heads=2, n_layers=2, qkv_bias=False,
                    tie_weights=False)
    model = GPTModel(cfg).eval()
    save_gpt2(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["eos_token_id"] is None  # vocab 300 has no 50256
    assert torch.equal(load_file(tmp_path / "model.safetensors")["transformer.h.1.attn.c_attn.bias"],
                       torch.zeros(96))
    hf, info = GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()
    reloaded = load_gpt2(tmp_path, device="cpu")
    assert reloaded.out_head.weight is not reloaded.embedding.tok_emb.weight and not reloaded.cfg.tie_weights
    ids = prompt(300, tokens=5)
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(ids).logits, model(ids), atol=1e-4, rtol=0)
        torch.testing.assert_close(reloaded(ids), model(ids), atol=1e-4, rtol=0)


def test_name_map_covers_every_hugging_face_parameter_exactly():
    hf = GPT2Model(GPT2Config(n_embd=32, n_layer=3, n_head=2, vocab_size=50, n_positions=8))
    ours = GPTModel(GPTConfig(vocab_size=50, context_length=8, emb_dim=32, n_heads=2, n_layers=3))  # tied
    rows = expand_name_map(3)
    assert {hf_name for _, hf_name, _, _ in rows} == set(hf.state_dict())
    assert {name for name, _, _, _ in rows} == set(dict(ours.named_parameters()))
    assert len(rows) == 4 + 3 * 16


def hub_style_state(hf: GPT2LMHeadModel) -> dict[str, torch.Tensor]:
    """The state dict the way the Hub's original gpt2 file stores it: no "transformer." prefix, the causal
    mask buffers h.N.attn.bias and h.N.attn.masked_bias, and lm_head.weight equal to wte.weight."""
    state = {k.removeprefix("transformer."): v.clone() for k, v in hf.state_dict().items()}
    n = hf.config.n_positions
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return state


def small_model(tie_weights: bool = True) -> GPTModel:
    cfg = GPTConfig(vocab_size=1000, context_length=64, emb_dim=64, n_heads=4, n_layers=2, tie_weights=tie_weights)
    return GPTModel(cfg).eval()


def test_hub_style_names_buffers_and_tied_lm_head_are_accepted():
    hf = hf_model(**SMALL)
    state = hub_style_state(hf)
    assert "lm_head.weight" in state and "h.0.attn.bias" in state and "wte.weight" in state
    model = small_model()
    fill_from_hf(model, state)
    ids = prompt(1000)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_a_tied_lm_head_that_differs_from_wte_is_refused():
    state = hub_style_state(hf_model(**SMALL))
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ValueError, match=r"^state dict: lm_head.weight differs from wte.weight, but the "
                                         r"config ties them: set tie_word_embeddings to false"):
        fill_from_hf(small_model(), state)


@pytest.fixture(scope="module")
def small_state():
    """The SMALL model's tensors as save_pretrained stores them: the tied lm_head.weight left out."""
    return {k: v for k, v in hf_model(**SMALL).state_dict().items() if k != "lm_head.weight"}


def test_a_missing_key_is_named(small_state):
    state = dict(small_state)
    del state["transformer.h.1.ln_2.bias"]
    with pytest.raises(ValueError, match=r"^state dict: missing key h.1.ln_2.bias: the file is incomplete"):
        fill_from_hf(small_model(), state)


def test_an_untied_model_needs_lm_head(small_state):
    with pytest.raises(ValueError, match=r"^state dict: missing key lm_head.weight: "):
        fill_from_hf(small_model(tie_weights=False), small_state)


def test_an_extra_key_is_named(small_state):
    state = dict(small_state, **{"transformer.h.2.ln_1.weight": torch.ones(64), "score.weight": torch.ones(2)})
    with pytest.raises(ValueError, match=r"^state dict: unexpected key h.2.ln_1.weight \(and 1 more: "
                                         r"score.weight\): it is not a GPT-2 weight"):
        fill_from_hf(small_model(), state)


def test_a_wrong_shape_is_named_with_both_shapes(small_state):
    state = dict(small_state, **{"transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 250)})
    with pytest.raises(ValueError, match=r"^state dict: h.1.mlp.c_fc.weight is torch.float32 \(64, 250\), "
                                         r"expected a floating-point tensor of shape \(64, 256\)$"):
        fill_from_hf(small_model(), state)


def test_a_transposed_conv1d_weight_is_a_wrong_shape(small_state):
    weight = small_state["transformer.h.0.mlp.c_proj.weight"]  # (256, 64) in Conv1D layout
    state = dict(small_state, **{"transformer.h.0.mlp.c_proj.weight": weight.T})
    with pytest.raises(ValueError, match=r"h.0.mlp.c_proj.weight is torch.float32 \(64, 256\), expected a "
                                         r"floating-point tensor of shape \(256, 64\)"):
        fill_from_hf(small_model(), state)


def test_integer_tensors_and_doubled_keys_are_refused(small_state):
    state = dict(small_state, **{"transformer.ln_f.bias": torch.zeros(64, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"^state dict: ln_f.bias is torch.int64 \(64,\), expected a "
                                         r"floating-point tensor of shape \(64,\)$"):
        fill_from_hf(small_model(), state)
    state = dict(small_state, **{"ln_f.bias": torch.zeros(64)})
    with pytest.raises(ValueError, match=r"^state dict: ln_f.bias is stored twice, with and without the "
                                         r"'transformer.' prefix"):
        fill_from_hf(small_model(), state)


def test_fill_from_hf_refuses_models_the_map_cannot_fill(small_state):
    cfg = GPTConfig(vocab_size=1000, context_length=64, emb_dim=64, n_heads=4, n_layers=2, qkv_bias=False)
    with pytest.raises(ValueError, match=r"^model and GPT2_NAME_MAP differ in \['trf_blocks.0.att.W_key.bias', "
                                         r"'trf_blocks.0.att.W_query.bias', 'trf_blocks.0.att.W_value.bias'\]: "
                                         r"GPT-2 fills exactly the parameters of a GPTModel with qkv_bias=True$"):
        fill_from_hf(GPTModel(cfg), small_state)
    model = small_model()
    before = {name: p.clone() for name, p in model.named_parameters()}
    model.extra_scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"^model and GPT2_NAME_MAP differ in \['extra_scale'\]"):
        fill_from_hf(model, small_state)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters() if name in before), \
        "refused before anything was copied"
    with pytest.raises(TypeError, match=r"^model must be a GPTModel, got GPT2LMHeadModel: fill a course_lib GPTModel"):
        fill_from_hf(hf_model(**SMALL), small_state)


def test_load_gpt2_names_the_file_and_key_of_a_bad_state_dict(small_dir, tmp_path):
    directory = small_dir
    state = load_file(directory / "model.safetensors")
    del state["transformer.wpe.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(ValueError, match=r"model.safetensors: missing key wpe.weight: "):
        load_gpt2(tmp_path, device="cpu")


def test_a_truncated_safetensors_file_gives_a_clear_error(small_dir, tmp_path):
    directory = small_dir
    data = (directory / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file \(.*\): it is "
                                         r"truncated or corrupt, e.g. by an interrupted download; delete it"):
        load_gpt2(tmp_path, device="cpu")


@pytest.mark.parametrize("change, message", [
    ({"layer_norm_epsilon": 1e-6}, r"layer_norm_epsilon is 1e-06, but course_lib's GPTModel needs 1e-05"),
    ({"activation_function": "relu"}, r"activation_function is 'relu', but course_lib's GPTModel needs "
                                      r"'gelu_new' or 'gelu_pytorch_tanh'"),
    ({"n_inner": 100}, r"n_inner is 100, but course_lib's GPTModel needs None or 256"),
    ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx is True"),
    ({"tie_word_embeddings": "yes"}, r"tie_weights must be True or False, got 'yes' \(.*tie_word_embeddings tie_weights\)"),
    ({"n_embd": "64"}, r"emb_dim must be an int, got '64' \(str\) \(GPT-2's n_embd is our emb_dim"),
    ({"n_layer": 0}, r"n_layers must be >= 1, got 0 \(.*n_layer n_layers"),
    ({"n_head": 5}, r"emb_dim 64 is not divisible by n_heads 5.*\(GPT-2's n_embd is our emb_dim"),
    ({"model_type": "llama"}, r"model_type is 'llama', not 'gpt2': load_gpt2 reads GPT-2 checkpoints only"),
])
def test_a_bad_config_value_gives_a_clear_error(small_dir, tmp_path, change, message):
    directory = small_dir
    config = json.loads((directory / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"config.json: " + message):
        load_gpt2(tmp_path, device="cpu")


def test_config_defaults_and_n_ctx_follow_hugging_face():
    cfg = config_from_hf({"n_ctx": 512, "n_layer": 2})  # everything else: GPT2Config's defaults
    assert cfg == GPTConfig(context_length=512, n_layers=2) and cfg.tie_weights is True
    assert config_from_hf({"tie_word_embeddings": False}) == GPTConfig(tie_weights=False)
    with pytest.raises(TypeError, match=r"^config: hf_config must be a dict of GPT-2 settings \(config.json's object\), "
                                        r"got list$"):
        config_from_hf([1, 2])


def test_invalid_json_in_config_gives_a_clear_error(small_dir, tmp_path):
    directory = small_dir
    (tmp_path / "config.json").write_text('{"n_embd": 64,')
    (tmp_path / "model.safetensors").symlink_to(directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON \(.*\): download it again or rewrite"):
        load_gpt2(tmp_path, device="cpu")


def test_missing_directory_files_and_bad_arguments(tmp_path, small_state):
    with pytest.raises(FileNotFoundError, match=r"config.json does not exist: a GPT-2 directory holds "
                                                r"config.json and model.safetensors \(or its shards and "
                                                r"model.safetensors.index.json\); write one with save_gpt2"):
        load_gpt2(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"model.safetensors does not exist \(this directory has "
                                                r"pytorch_model.bin: convert it with"):
        load_gpt2(tmp_path)
    with pytest.raises(ValueError, match=r"config.json' is neither a directory nor a GPT-2 name: pass a directory"):
        load_gpt2(tmp_path / "config.json")
    with pytest.raises(TypeError, match=r"^path_or_name must be a directory or a GPT-2 name like 'gpt2', got 124$"):
        load_gpt2(124)
    save_file(small_state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    with pytest.raises(ValueError, match=r"^device must be None, a torch.device or a name like 'cpu' or "
                                         r"'cuda', got 'gpu0'"):
        load_gpt2(tmp_path, device="gpu0")
    assert load_gpt2(tmp_path, device="cpu").cfg.emb_dim == 64  # the same folder loads with a real device
    with pytest.raises(TypeError, match=r"^model must be a GPTModel, got dict: pass a course_lib GPTModel"):
        save_gpt2(small_state, tmp_path / "out")
    with pytest.raises(TypeError, match=r"^model must be a GPTModel, got dict: pass a course_lib GPTModel$"):
        hf_state_from(small_state)
    with pytest.raises(TypeError, match=r"^directory must be a folder path \(str or Path\), got None$"):
        save_gpt2(small_model(), None)
    with pytest.raises(FileExistsError, match=r"File exists: '.*config.json'"):  # Python's own, before any write
        save_gpt2(small_model(), tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text()) == SMALL, "the file is left as it was"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test loudly."""
    def refuse(*args, **kwargs):
        raise AssertionError("the test tried to use the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("name", ["gpt3", "GPT2", "gpt2-small", "openai-community/gpt2"])
def test_an_unknown_model_name_fails_before_any_download(no_network, monkeypatch, tmp_path, name):
    monkeypatch.chdir(tmp_path)  # so that no folder of that name exists
    with pytest.raises(ValueError, match=rf"^'{name}' is neither a directory nor a GPT-2 name: pass a directory "
                                         r"with config.json and model.safetensors, or one of gpt2, gpt2-medium, "
                                         r"gpt2-large, gpt2-xl$"):
        load_gpt2(name)


def test_a_known_name_downloads_both_files_from_its_hub_repo(no_network, monkeypatch, small_dir):
    directory = small_dir
    requests = []

    cached = set()

    def fake_download(repo_id, filename, local_files_only=False):  # huggingface_hub's cached download
        requests.append((repo_id, filename, local_files_only))
        if local_files_only and filename not in cached:
            raise LocalEntryNotFoundError("not in the cache yet")
        cached.add(filename)
        return str(directory / filename)

    monkeypatch.setattr(pretrained, "hf_hub_download", fake_download)
    monkeypatch.setattr(pretrained, "hub_reachable", lambda: True)
    model = load_gpt2("gpt2-medium", device="cpu")
    assert requests == [("openai-community/gpt2-medium", "config.json", True),  # the cache first
                        ("openai-community/gpt2-medium", "config.json", False),
                        ("openai-community/gpt2-medium", "model.safetensors", False)]
    assert model.cfg.emb_dim == SMALL["n_embd"]
    requests.clear()
    load_gpt2("gpt2-medium", device="cpu")  # now cached: no download at all
    assert [local for *_, local in requests] == [True, True]
    assert model.cfg.emb_dim == SMALL["n_embd"]


def test_a_failed_download_says_what_to_do(no_network, monkeypatch):
    def offline(repo_id, filename, local_files_only=False):  # no cached copy, and the download fails
        raise LocalEntryNotFoundError("cannot reach huggingface.co")

    monkeypatch.setattr(pretrained, "hf_hub_download", offline)
    monkeypatch.setattr(pretrained, "hub_reachable", lambda: True)  # the name resolves, the download fails
    with pytest.raises(OSError, match=r"^could not download 'gpt2' \(openai-community/gpt2\) from the Hugging "
                                      r"Face Hub: check the network, or fetch config.json and model.safetensors "
                                      r"elsewhere and pass their directory. The Hub said: cannot reach huggingface.co$"):
        load_gpt2("gpt2")


def test_fill_from_hf_refuses_what_is_not_a_state_dict():
    model = GPTModel(GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1))
    with pytest.raises(TypeError, match=r"^hf_state must be a dict, got list: pass a state dict"):
        fill_from_hf(model, list(model.state_dict().values()))


@pytest.mark.parametrize("offline_flag", [True, False])
def test_offline_fails_at_once_naming_hf_hub_offline_and_the_folder_route(no_network, monkeypatch, offline_flag):
    calls = []

    def cache_only(repo_id, filename, local_files_only=False):
        calls.append(local_files_only)
        if not local_files_only:
            raise AssertionError("a download was attempted")
        raise LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(pretrained, "hf_hub_download", cache_only)
    monkeypatch.setattr(pretrained.hf_constants, "HF_HUB_OFFLINE", offline_flag)
    if not offline_flag:  # no HF_HUB_OFFLINE, but the Hub's name does not resolve: one failed DNS lookup
        def no_dns(*args, **kwargs):
            raise socket.gaierror(-2, "Name or service not known")
        monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    why = "HF_HUB_OFFLINE is set" if offline_flag else "there is no network"
    with pytest.raises(OSError, match=rf"'gpt2' is not in the Hugging Face cache and {why}, so it cannot be "
                                      r"downloaded: .* offline, copy a folder with config.json and "
                                      r"model.safetensors here and pass its path, load_gpt2\('path/to/folder'\)"):
        load_gpt2("gpt2")
    assert calls == [True], "only the cache was asked"


def test_a_sharded_folder_loads_like_a_single_file(tmp_path):
    torch.manual_seed(0)
    hf_model = GPT2LMHeadModel(GPT2Config(**SMALL)).eval()
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    ids = torch.randint(0, SMALL["vocab_size"], (2, 7))
    with torch.no_grad():
        gap = (load_gpt2(tmp_path, device="cpu")(ids) - hf_model(ids).logits).abs().max().item()
    assert gap < 1e-5
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"No such file or directory: .*{shard.name}"):  # safetensors' own
        load_gpt2(tmp_path)


def test_save_gpt2_over_a_sharded_folder_leaves_nothing_stale(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**SMALL)).save_pretrained(tmp_path, max_shard_size="100KB")
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 7, "max_length": 3}')
    ours = GPTModel(config_from_hf(SMALL))
    save_gpt2(ours, tmp_path)
    assert not (tmp_path / "model.safetensors.index.json").exists() and not list(tmp_path.glob("model-*"))
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {"bos_token_id": None,
                                                                             "eos_token_id": None}
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, SMALL["vocab_size"], (1, 5))
    with torch.no_grad():
        assert (ours.eval()(ids) - reloaded(ids).logits).abs().max() < 1e-5


def test_a_gpt2_vocabulary_folder_works_in_pipeline_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=50257, context_length=32, emb_dim=16, n_heads=2, n_layers=1))
    save_gpt2(model, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Hello, world! Tokens: 1234 éß"
    assert tokenizer(text)["input_ids"] == gpt2_tokenizer().encode(text)
    generator = transformers.pipeline("text-generation", model=str(tmp_path), device="cpu")
    out = generator("Hello", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    expected = generate(model.eval(), torch.tensor([gpt2_tokenizer().encode("Hello")]), 5)
    assert out == gpt2_tokenizer().decode(expected[0].tolist()) and out != "Hello"
