"""Notebook 15's core (course_lib/alignment.py) equals TRL 1.16, the library practitioners use:
sequence log-probabilities equal a direct per-token sum, TRL's selective_log_softmax and TRL's fused LM head; the DPO
loss equals DPOTrainer's "sigmoid" loss; group-normalised advantages equal the ones GRPOTrainer computes from the
rewards; the GRPO loss equals GRPOTrainer's for the loss types "grpo", "bnpo", "dr_grpo" and "dapo".

TRL's own code runs in every comparison, nothing of it is re-typed here: real DPOTrainer and GRPOTrainer objects are
built offline around a tiny transformers GPT2LMHeadModel, and their compute_loss is called on a batch. Where a test
needs TRL's loss on *fixed* log-probabilities, the `model` argument of compute_loss is a stand-in whose forward
returns those log-probabilities in TRL's own output type (FusedCausalLMOutput), as the fused LM head TRL adds to a
real model would. The configs set bf16=False: TRL 1.16 defaults to bf16=True, and then runs the reference model (DPO)
or every forward (GRPO) under bfloat16 autocast, even on the CPU. The trainers' model is put in eval mode: in train mode, TRL also divides by the number of gradient
accumulation steps, an attribute the Trainer sets only inside its training loop (1 here)."""

import pytest
import torch

import course_lib.alignment as core
from course_lib.config import GPTConfig
from course_lib.finetuning import CHAT_TOKENS, ChatTokenizer, format_chat
from course_lib.model import GPTModel
from course_lib.pretrained import load_gpt2, save_gpt2
from course_lib.tokenization import CharTokenizer

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

TRIPLES = [  # (instruction, chosen, rejected): exact answers beat wrong ones, of other lengths
    ("Upper case:\nGood morrow.", "GOOD MORROW.", "Good morrow."),
    ("Last word, in capitals:\nIs it near day?", "DAY", "NEAR"),
    ("How many words?\nHo, Romeo!", "two", "three, sir"),
]
PROMPTS = ["Upper case:\nhie", "Upper case:\nyou"]  # GRPO: prompts of equal length, so that nothing is left-padded


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tokenizer():
    chars = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:.,!?' \n"))
    return ChatTokenizer(CharTokenizer(chars))


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer):
    """The same character tokenizer for transformers and TRL: one id per character, the chat tokens as specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(tokenizer.char_tokenizer.chars)} | tokenizer.special_ids
    inner = Tokenizer(models.WordLevel(vocab, unk_token=None))
    inner.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    inner.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|end|>", pad_token="<|end|>",
                                                additional_special_tokens=list(CHAT_TOKENS[:2]))


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    """A tiny reference model and a policy that differs from it, ours and Hugging Face's, saved as GPT-2 folders."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ref = GPTModel(GPTConfig(vocab_size=tokenizer.vocab_size, context_length=64, emb_dim=32, n_heads=2,
                             n_layers=2)).eval()
    folder = tmp_path_factory.mktemp("alignment")
    ref_dir = save_gpt2(ref, folder / "ref")
    hf_policy = transformers.GPT2LMHeadModel.from_pretrained(ref_dir).eval()  # its name_or_path is ref_dir
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf_policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    policy_dir = folder / "policy"
    hf_policy.save_pretrained(policy_dir)
    return {"ref": ref, "policy": load_gpt2(policy_dir, "cpu").eval(), "ref_dir": ref_dir, "policy_dir": policy_dir}


def hf_model(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder).eval()


class FixedLogProbs(torch.nn.Module):
    """A stand-in for a model with TRL's fused LM head: whatever it is asked, it returns `log_probs` (batch, tokens - 1),
    zeroed where the label is -100, as the fused head does, in TRL's own output type."""

    def __init__(self, log_probs):
        super().__init__()
        self.log_probs = log_probs
        self.calls = 0

    def forward(self, input_ids=None, labels=None, fused_lm_head=False, **kwargs):
        from trl.trainer.utils import FusedCausalLMOutput

        assert fused_lm_head and labels.shape[1] == self.log_probs.shape[1] + 1
        self.calls += 1
        keep = labels[:, 1:] != -100
        zeros = torch.zeros_like(self.log_probs).detach()
        return FusedCausalLMOutput(log_probs=self.log_probs * keep, entropy=zeros, mean_logits=zeros,
                                   is_top1=torch.zeros_like(keep), label_mask=keep)


def dpo_trainer(hf_tokenizer, tmp_path, policy, beta, ref=None, precompute=False):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    dataset = Dataset.from_list([{"prompt": format_chat(i), "chosen": c, "rejected": r} for i, c, r in TRIPLES])
    config = DPOConfig(output_dir=str(tmp_path / f"dpo{beta}"), report_to=[], use_cpu=True, bf16=False, beta=beta,
                       per_device_train_batch_size=len(TRIPLES), max_length=None, precompute_ref_log_probs=precompute)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=config, train_dataset=dataset, processing_class=hf_tokenizer)
    assert trainer.loss_types == ["sigmoid"] and trainer.f_divergence_type == "reverse_kl" and trainer.beta == beta
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(TRIPLES))])  # [chosen..., rejected...]
    return trainer, dict(batch)


def our_pairs(rows):
    return [(i, c) for i, c, _ in rows] + [(i, r) for i, _, r in rows]  # TRL's order: the chosen, then the rejected


# ------------------------------------------------------------------------------------------------ log-probabilities
def test_sequence_logprobs_equal_a_direct_sum_and_trls_selective_log_softmax(tokenizer, saved):
    from trl.trainer.utils import selective_log_softmax

    model = saved["policy"]
    ids, mask = core.response_batch(tokenizer, our_pairs(TRIPLES), 64)  # (6, tokens) each
    with torch.no_grad():
        per_token = core.token_logprobs(model, ids, mask)  # (6, tokens - 1)
        seq = core.sequence_logprobs(model, ids, mask)  # (6,)
        by_hand = torch.zeros(len(ids))
        for row in range(len(ids)):  # each response token scored by its own forward pass on the text before it
            for t in mask[row].nonzero().flatten().tolist():
                by_hand[row] += model(ids[row:row + 1, :t])[0, -1].log_softmax(-1)[ids[row, t]]
        trl_per_token = selective_log_softmax(model(ids[:, :-1]), ids[:, 1:]) * mask[:, 1:]
    assert seq.shape == (6,) and per_token.shape == (6, ids.shape[1] - 1) and per_token.dtype == torch.float32
    assert torch.allclose(seq, by_hand, atol=1e-4), "the sum is not over exactly the response tokens"
    assert torch.allclose(per_token, trl_per_token, atol=1e-5)
    assert (per_token[mask[:, 1:] == 0] == 0).all(), "a prompt or padding token is counted"
    full_sum = (selective_log_softmax(model(ids[:, :-1]), ids[:, 1:])).sum(-1).detach()
    assert (full_sum - seq).abs().min() > 1, "the prompt's tokens must change the sum when counted"


def test_sequence_logprobs_equal_trls_fused_lm_head(tokenizer, saved):
    """The per-token log-probs TRL's trainers read: the fused LM head that DPOTrainer and GRPOTrainer add to a model."""
    from trl.trainer.utils import add_fused_lm_head

    hf = hf_model(saved["policy_dir"])
    add_fused_lm_head(hf)
    ids, mask = core.response_batch(tokenizer, our_pairs(TRIPLES), 64)
    with torch.no_grad():
        theirs = hf(input_ids=ids, labels=ids.masked_fill(mask == 0, -100), fused_lm_head=True).log_probs
        ours = core.token_logprobs(saved["policy"], ids, mask)
    assert theirs.shape == ours.shape and torch.allclose(theirs, ours, atol=1e-5)


# ------------------------------------------------------------------------------------------------ DPO
def test_the_batch_is_trls_dpo_batch(tokenizer, hf_tokenizer, saved, tmp_path):
    """TRL tokenizes prompt, chosen and rejected itself and appends <|end|>: the same ids and the same mask."""
    _, batch = dpo_trainer(hf_tokenizer, tmp_path, hf_model(saved["policy_dir"]), 0.1, ref=hf_model(saved["ref_dir"]))
    ids, mask = core.response_batch(tokenizer, our_pairs(TRIPLES), 64)
    assert torch.equal(batch["input_ids"], ids)
    assert torch.equal(batch["completion_mask"], mask)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_equals_trls_sigmoid_loss_on_fixed_logprobs(hf_tokenizer, saved, tmp_path, beta):
    """Fixed random per-token log-probs for the policy (through the stand-in model) and fixed reference sequence
    log-probs (through TRL's precomputed-reference columns): the loss, its gradient and the logged rewards."""
    trainer, batch = dpo_trainer(hf_tokenizer, tmp_path, hf_model(saved["policy_dir"]), beta, precompute=True)
    generator = torch.Generator().manual_seed(2)
    n, width = batch["input_ids"].shape
    per_token = (-3 * torch.rand(n, width - 1, generator=generator)).requires_grad_()  # (6, tokens - 1)
    seq = (per_token.detach() * batch["completion_mask"][:, 1:]).sum(-1)  # (6,): the policy's sequence log-probs
    ref_chosen, ref_rejected = (seq + 2 * torch.randn(n, generator=generator)).chunk(2)  # (3,) each, near the policy
    batch |= {"ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    stand_in = FixedLogProbs(per_token)
    trainer._metrics["eval"].clear()
    theirs = trainer.compute_loss(stand_in, batch)
    (grad_theirs,) = torch.autograd.grad(theirs, per_token)
    assert stand_in.calls == 1, "TRL must read the policy from the stand-in and the reference from the batch"

    seq = (per_token * batch["completion_mask"][:, 1:]).sum(-1)  # (6,), now with the gradient
    loss, chosen_rewards, rejected_rewards = core.dpo_loss(seq[:n // 2], seq[n // 2:], ref_chosen, ref_rejected, beta)
    (grad_ours,) = torch.autograd.grad(loss, per_token)
    assert 0.05 < loss.item() < 5, "a batch whose pairs are neither all won nor all lost"
    assert (loss - theirs).abs() < 1e-6
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-7), "the same gradient, token by token"
    logged = trainer._metrics["eval"]
    assert abs(chosen_rewards.mean().item() - logged["rewards/chosen"][-1]) < 1e-5
    assert abs(rejected_rewards.mean().item() - logged["rewards/rejected"][-1]) < 1e-5
    assert abs((chosen_rewards - rejected_rewards).mean().item() - logged["rewards/margins"][-1]) < 1e-5
    assert (chosen_rewards > rejected_rewards).float().mean().item() == logged["rewards/accuracies"][-1]


def test_dpo_end_to_end_equals_trl(tokenizer, hf_tokenizer, saved, tmp_path):
    """Real models: TRL's DPOTrainer with a policy and a reference that differ, against our log-probs and loss."""
    beta = 0.1
    trainer, batch = dpo_trainer(hf_tokenizer, tmp_path, hf_model(saved["policy_dir"]), beta,
                                 ref=hf_model(saved["ref_dir"]))
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch)
        ids, mask = core.response_batch(tokenizer, our_pairs(TRIPLES), 64)
        policy, ref = core.sequence_logprobs(saved["policy"], ids, mask), core.sequence_logprobs(saved["ref"], ids, mask)
        loss, chosen_rewards, rejected_rewards = core.dpo_loss(policy[:3], policy[3:], ref[:3], ref[3:], beta)
    assert (chosen_rewards - rejected_rewards).abs().max() > 0.01, "the policy must differ from the reference"
    assert (loss - theirs).abs() < 1e-5
    assert abs(chosen_rewards.mean().item() - trainer._metrics["eval"]["rewards/chosen"][-1]) < 1e-5


# ------------------------------------------------------------------------------------------------ GRPO
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # one right in the first group; the second all right: advantages 0


def grpo_trainer(hf_tokenizer, saved, tmp_path, loss_type, beta=0.04, epsilon=0.2, max_completion_length=6,
                 kl_correction=True):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def fixed_reward(completions, **kwargs):  # the checker's verdicts, fixed in advance
        assert len(completions) == len(REWARDS)
        return REWARDS

    config = GRPOConfig(output_dir=str(tmp_path / loss_type), report_to=[], use_cpu=True, bf16=False, loss_type=loss_type,
                        beta=beta, epsilon=epsilon, num_generations=4, per_device_train_batch_size=8,
                        max_completion_length=max_completion_length, use_bias_correction_kl=kl_correction, seed=0)
    dataset = Dataset.from_list([{"prompt": format_chat(p)} for p in PROMPTS])
    policy = hf_model(saved["ref_dir"])  # TRL loads its reference from the policy's name_or_path: the starting point
    policy.load_state_dict(hf_model(saved["policy_dir"]).state_dict())  # a policy that has moved away from it
    trainer = GRPOTrainer(model=policy, reward_funcs=fixed_reward, args=config, train_dataset=dataset,
                          processing_class=hf_tokenizer)
    trainer.model.eval()
    assert trainer.scale_rewards == "group" and trainer.importance_sampling_level == "token"
    assert trainer.epsilon_low == trainer.epsilon_high == epsilon and trainer.beta == beta
    return trainer


@pytest.fixture(scope="module")
def rollout(hf_tokenizer, saved, tmp_path_factory):
    """One real GRPO step's batch: TRL samples 4 completions per prompt from the policy, scores them with the fixed
    rewards, normalises the advantages and computes the reference's log-probs (TRL's loss type "dapo", its default)."""
    trainer = grpo_trainer(hf_tokenizer, saved, tmp_path_factory.mktemp("grpo"), "dapo")
    torch.manual_seed(3)
    with torch.no_grad():
        batch = trainer._generate_and_score_completions([{"prompt": format_chat(p)} for p in PROMPTS for _ in "abcd"])
    return trainer, batch


def test_group_advantages_equal_trls(rollout):
    _, batch = rollout
    ours = core.group_advantages(torch.tensor(REWARDS), 4)
    assert torch.allclose(ours, batch["advantages"], atol=1e-6)
    assert torch.equal(ours[4:], torch.zeros(4)), "a group of equal rewards teaches nothing"
    assert abs(ours[0].item() - 1.5) < 1e-3, "(1 - 0.25) / 0.5: the sample std (divided by n - 1), not the population's"


def test_grpo_end_to_end_equals_trl(rollout, saved):
    """Real sampled completions, real reference log-probs: TRL's loss against ours on our models' log-probs."""
    trainer, batch = rollout
    prompt_ids, completion_ids, mask = batch["prompt_ids"], batch["completion_ids"], batch["completion_mask"]
    assert batch["prompt_mask"].all(), "no prompt is padded"
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (8, prompt + completion)
    full_mask = torch.cat([torch.zeros_like(prompt_ids), mask], dim=1)
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch)
        width = completion_ids.shape[1]
        logps = core.token_logprobs(saved["policy"], ids, full_mask)[:, -width:]  # (8, completion tokens)
        ref_logps = core.token_logprobs(saved["ref"], ids, full_mask)[:, -width:]
        ours = core.grpo_loss(logps, logps, ref_logps, batch["advantages"], mask, 0.04, 0.2, "dapo")
    assert torch.allclose(ref_logps, batch["ref_per_token_logps"] * mask, atol=1e-5)
    assert (core.k3_kl(logps, ref_logps) * mask).sum() > 1e-3, "the policy must differ from the reference"
    assert (ours - theirs).abs() < 1e-6


@pytest.fixture(scope="module")
def fixed_batch():
    """Fixed per-token log-probs of 4 completions of up to 5 tokens: old ones far enough from the new ones that the
    ratio is clipped on both sides, a reference, advantages of both signs and completions of different lengths."""
    generator = torch.Generator().manual_seed(4)
    logps = -3 * torch.rand(4, 5, generator=generator)
    return {"logps": logps,
            "old_logps": logps + 0.4 * torch.randn(4, 5, generator=generator),
            "ref_logps": logps + 0.3 * torch.randn(4, 5, generator=generator),
            "advantages": torch.tensor([1.2, -0.7, 0.4, -0.9]),
            "mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])}


@pytest.mark.parametrize("kl_correction", [True, False], ids=["kl_corrected", "kl_plain"])
@pytest.mark.parametrize("loss_type", core.GRPO_LOSS_TYPES)
def test_grpo_loss_equals_trls_on_a_fixed_batch(hf_tokenizer, saved, tmp_path, fixed_batch, loss_type, kl_correction):
    """TRL's _compute_loss (through compute_loss) with the fixed policy log-probs coming from the stand-in model and the
    old and reference log-probs from the batch: the loss, its gradient, and the mean KL TRL logs. TRL 1.16 weights the
    KL term by the ratio by default (use_bias_correction_kl=True); both settings are checked."""
    trainer = grpo_trainer(hf_tokenizer, saved, tmp_path, loss_type, beta=0.04, epsilon=0.2, max_completion_length=7,
                           kl_correction=kl_correction)
    b = fixed_batch
    ratio = (b["logps"] - b["old_logps"]).exp()[b["mask"] == 1]
    assert (ratio < 0.8).any() and (ratio > 1.2).any(), "the batch must exercise the clipping on both sides"
    n_prompt = 3
    logps = b["logps"].clone().requires_grad_()
    stand_in = FixedLogProbs(torch.cat([torch.zeros(4, n_prompt - 1), logps], dim=1))  # (4, prompt + completion - 1)
    batch = {"prompt_ids": torch.zeros(4, n_prompt, dtype=torch.long), "prompt_mask": torch.ones(4, n_prompt,
             dtype=torch.long), "completion_ids": torch.ones(4, 5, dtype=torch.long), "completion_mask": b["mask"],
             "advantages": b["advantages"], "old_per_token_logps": b["old_logps"], "ref_per_token_logps":
             b["ref_logps"], "num_items_in_batch": b["mask"].sum()}
    trainer._metrics["eval"].clear()
    theirs = trainer.compute_loss(stand_in, batch)
    (grad_theirs,) = torch.autograd.grad(theirs, logps)
    ours = core.grpo_loss(logps, b["old_logps"], b["ref_logps"], b["advantages"], b["mask"], 0.04, 0.2, loss_type,
                          kl_correction=kl_correction, max_completion_length=7)
    (grad_ours,) = torch.autograd.grad(ours, logps)
    assert (ours - theirs).abs() < 1e-6
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-7), "the same gradient, token by token"
    kl = core.k3_kl(b["logps"], b["ref_logps"]) * (ratio_all(b) if kl_correction else 1)
    kl = (kl * b["mask"]).sum() / b["mask"].sum()
    assert abs(kl.item() - trainer._metrics["eval"]["kl"][-1]) < 1e-6, "TRL's logged KL is the k3 estimate"


def ratio_all(b):
    return (b["logps"] - b["old_logps"]).exp()  # (batch, tokens): pi / pi_old


def test_the_loss_types_differ_on_the_fixed_batch(fixed_batch):
    """The four normalisations are four different numbers on completions of unequal length (dapo = bnpo here)."""
    b = fixed_batch
    losses = {t: core.grpo_loss(b["logps"], b["old_logps"], b["ref_logps"], b["advantages"], b["mask"], 0.04, 0.2, t,
                                max_completion_length=7).item() for t in core.GRPO_LOSS_TYPES}
    assert losses["dapo"] == losses["bnpo"]
    assert min(abs(losses[a] - losses[b]) for a, b in [("grpo", "bnpo"), ("grpo", "dr_grpo"), ("bnpo", "dr_grpo")]) > 1e-3


# ------------------------------------------------------------------------------------------------ the doors
def test_doors_name_the_argument(tokenizer, saved, fixed_batch):
    ids, mask = core.response_batch(tokenizer, our_pairs(TRIPLES[:1]), 64)
    with pytest.raises(ValueError, match=r"response_mask\[:, 0\] is 1"):
        core.sequence_logprobs(saved["ref"], ids, torch.ones_like(mask))
    with pytest.raises(ValueError, match="row 1 of response_mask has no response token"):
        core.sequence_logprobs(saved["ref"], ids, mask * torch.tensor([[1], [0]]))
    with pytest.raises(ValueError, match="response_mask must be a 0/1 or bool tensor of input_ids' shape"):
        core.sequence_logprobs(saved["ref"], ids, mask[:, 1:])
    with pytest.raises(ValueError, match=r"examples\[0\] is \d+ tokens long"):
        core.response_batch(tokenizer, [("a" * 70, "b")], 64)
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="beta must be in"):
        core.dpo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match=r"ref_rejected has shape \(2,\) but policy_chosen has \(3,\)"):
        core.dpo_loss(x, x, x, x[:2], 0.1)
    with pytest.raises(ValueError, match="rewards holds 6 completions, not a whole number of groups of group_size=4"):
        core.group_advantages(torch.zeros(6), 4)
    b = fixed_batch
    args = (b["logps"], b["old_logps"], b["ref_logps"], b["advantages"], b["mask"])
    with pytest.raises(ValueError, match="loss_type must be one of"):
        core.grpo_loss(*args, 0.04, 0.2, "sapo")
    with pytest.raises(ValueError, match="pass max_completion_length"):
        core.grpo_loss(*args, 0.04, 0.2, "dr_grpo")
    with pytest.raises(ValueError, match="beta is 0.04 but ref_logps is None"):
        core.grpo_loss(b["logps"], b["old_logps"], None, b["advantages"], b["mask"], 0.04, 0.2)
    with pytest.raises(ValueError, match=r"advantages must be \(batch,\) = \(4,\)"):
        core.grpo_loss(*args[:3], b["advantages"][:3], b["mask"], 0.04, 0.2)
