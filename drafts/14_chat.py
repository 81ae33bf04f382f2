# Draft of notebook 14's section "Instruction following" (issue 32, part 3), in percent format, like
# drafts/14_lora.py: `# %% [markdown]` opens a markdown cell, `# %%` a code cell, `id="..."` is the cell id. Cells
# that start with `#| export` make the end of course_lib/finetuning.py. It follows the LoRA section in the same
# notebook and uses its names (apply_lora, lora_state_dict, ...) and its first cell's imports.

# %% [markdown]
# ## Instruction following
#
# **What you will build.** A chat format with three new tokens, `<|user|>`, `<|assistant|>` and `<|end|>`; the
# model grown to know them, with every old weight kept; a loss that counts only the model's side of the
# conversation; a small instruction set whose answers a program can check; and a chat loop that stops when the
# model ends its turn.
#
# **What you need.** The LoRA section above, the training loss of notebook 09, `generate` with `eos_id` from
# notebook 08, and the shipped Shakespeare model of notebook 10.
#
# **Where it sits in the diagram.** At both ends of the model: the token embedding (bottom) and the output head
# (top) get new rows for the new tokens. Everything between them is the pretrained model plus LoRA adapters.
#
# `tests/test_finetuning_chat.py` proves the masked loss equal to the completion-only loss of Hugging Face's TRL
# (`SFTTrainer` with `completion_only_loss=True`) on the same batch, and the grown model's old logits equal to the
# base model's, bit for bit.

# %% id="chat-imports"
#| export
import copy
import json
import random
from dataclasses import replace

from safetensors.torch import load_file

from course_lib.generation import generate
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt
from course_lib.tokenization import DATA_DIR, CharTokenizer, check_token_ids

# %% [markdown]
# ### A chat format
#
# A pretrained model continues text. To make it answer, we show it many exchanges of one fixed shape and train
# it to produce the answer part:
#
# `<|user|>` instruction `<|assistant|>` response `<|end|>`
#
# Each marker is one new token, not a string of characters: the model can never confuse it with text a user
# typed, and `<|end|>` is a single id that `generate(..., eos_id=...)` can stop at. The ids come after the 65
# characters: 65, 66 and 67.

# %% id="chat-tokens"
#| export
CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")  # opens a user's turn, opens the model's turn, ends a turn

# %% [markdown]
# Targets that must not count in the loss get the value -100, the default `ignore_index` of `F.cross_entropy`.

# %% id="ignore-index"
#| export
IGNORE_INDEX = -100  # a target that F.cross_entropy(..., ignore_index=IGNORE_INDEX) leaves out of the loss

# %% [markdown]
# ### Growing the vocabulary
#
# The embedding matrix `tok_emb.weight` has shape `(vocab_size, emb_dim)` = `(65, 256)`, and so has the head
# `out_head.weight`. Three new tokens need three new rows in each. The old rows stay exactly as they were, so on
# text without the new tokens the grown model computes exactly what the old one did: the old tokens' logits are
# unchanged, and each new token only adds one more logit.
#
# What should a new row hold? A random row of the pretrained scale would give the new tokens logits unrelated to
# the model's, sometimes large. Hewitt ("Initializing New Word Embeddings for Pretrained Language Models", 2021)
# proposed the **mean of the old rows**: in the head, the new token's logit is then the mean of the old logits,
# $w_\text{new}^\top h = \frac{1}{V}\sum_i w_i^\top h$, never above the largest one, so the new token starts out
# unlikely everywhere and the model's distribution over the old tokens hardly moves. In the embedding, the mean
# row is a vector of the kind the first block already reads. Training then moves the new rows to where they help.

# %% id="grow-vocabulary"
#| export
@torch.no_grad()
def grow_vocabulary(model: GPTModel, n_new: int) -> GPTModel:
    """A copy of `model` that knows n_new more tokens, numbered after the old ones: the token embedding and the
    output head get n_new new rows, each the mean of the old rows; the old rows are copied bit for bit, and the
    model passed in is left as it was. A tied model stays tied."""
    check_type("model", model, GPTModel, "pass a course_lib GPTModel, e.g. load_shakespeare_gpt()[0]")
    check_int("n_new", n_new, minimum=1)
    grown = copy.deepcopy(model)
    grown.cfg = replace(model.cfg, vocab_size=model.cfg.vocab_size + n_new)

    def with_mean_rows(weight: Tensor) -> nn.Parameter:  # (old, emb_dim) -> (old + n_new, emb_dim)
        mean = weight.float().mean(dim=0, keepdim=True).to(weight.dtype)  # (1, emb_dim), averaged in float32
        return nn.Parameter(torch.cat([weight, mean.expand(n_new, -1)]))

    grown.embedding.tok_emb.weight = with_mean_rows(model.embedding.tok_emb.weight)
    grown.embedding.tok_emb.num_embeddings = grown.cfg.vocab_size
    if model.cfg.tie_weights:  # one matrix, two roles, as before
        grown.out_head.weight = grown.embedding.tok_emb.weight
    else:
        grown.out_head.weight = with_mean_rows(model.out_head.weight)
    grown.out_head.out_features = grown.cfg.vocab_size
    return grown

# %% [markdown]
# Grow the shipped model by the three chat tokens and check the promise on a line of Shakespeare: the first 65
# logits are bit for bit the base model's (`torch.equal`, not a tolerance), and each new logit is the mean of the
# old ones.

# %%
from course_lib.training import load_shakespeare

base, char_tokenizer = load_shakespeare_gpt()
grown = grow_vocabulary(base, len(CHAT_TOKENS))
line = torch.tensor([char_tokenizer.encode("What is the city but the people?")])  # (1, 32)
with torch.no_grad():
    old_logits, new_logits = base(line), grown(line)  # (1, 32, 65) and (1, 32, 68)
assert torch.equal(new_logits[..., :65], old_logits)
assert torch.allclose(new_logits[..., 65:], old_logits.mean(-1, keepdim=True).expand(-1, -1, 3), atol=1e-4)
p_new = new_logits.softmax(-1)[..., 65:].sum(-1).max()
print(f"vocabulary {base.cfg.vocab_size} -> {grown.cfg.vocab_size}; head {tuple(grown.out_head.weight.shape)}")
print(f"the three new tokens together get at most {p_new:.1%} of the probability at any position")

# %% [markdown]
# Only the new rows should train: the old rows hold what pretraining learned. A gradient hook multiplies the
# gradient of the embedding and of the head by a mask that is 0 on the old rows. With weight decay 0, AdamW leaves
# a parameter whose gradient is always zero exactly where it was (its moments stay zero, and so does its step).

# %% id="train-new-rows"
#| export
def train_new_rows(model: GPTModel, first_new: int) -> list[Tensor]:
    """Make the token embedding and the output head trainable, but only their rows first_new, first_new + 1, ...:
    a gradient hook zeroes the gradient of every older row. Train them with weight_decay=0, so that AdamW leaves
    a row whose gradient is always zero exactly as it was. Returns the parameters (one if tied)."""
    check_type("model", model, GPTModel, "pass the model that grow_vocabulary returned")
    check_int("first_new", first_new, minimum=1)
    if first_new >= model.cfg.vocab_size:
        raise ValueError(f"first_new is {first_new}, but the vocabulary has only {model.cfg.vocab_size} tokens: pass "
                         "the old vocabulary size, the id of the first token grow_vocabulary added")
    params = [model.embedding.tok_emb.weight]
    if model.out_head.weight is not params[0]:
        params.append(model.out_head.weight)
    keep_old = torch.ones(model.cfg.vocab_size, 1, device=params[0].device, dtype=params[0].dtype)
    keep_old[:first_new] = 0  # (vocab_size, 1): 0 on the old rows, 1 on the new ones
    for p in params:
        p.requires_grad_(True)
        p.register_hook(lambda grad: grad * keep_old)  # (vocab_size, emb_dim): old rows get no gradient
    return params

# %% [markdown]
# ### The chat tokenizer
#
# `ChatTokenizer` wraps the `CharTokenizer`: it cuts the text at the chat markers, encodes each marker as its one
# id and everything else character by character. `format_chat` writes one exchange; it refuses a text that
# already contains a marker, which would end a turn in the middle.

# %% id="chat-tokenizer"
#| export
class ChatTokenizer:
    """A CharTokenizer plus the chat tokens CHAT_TOKENS, numbered after its characters (65 characters: ids 65,
    66, 67). encode reads each chat token as one id; decode writes it back as its text."""

    def __init__(self, char_tokenizer: CharTokenizer):
        check_type("char_tokenizer", char_tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. "
                   "load_shakespeare_gpt()[1]")
        self.char_tokenizer = char_tokenizer
        n = char_tokenizer.vocab_size
        self.special_ids = {token: n + i for i, token in enumerate(CHAT_TOKENS)}  # "<|user|>" -> 65, ...
        self.user_id, self.assistant_id, self.end_id = self.special_ids.values()
        self.splitter = re.compile("(" + "|".join(re.escape(token) for token in CHAT_TOKENS) + ")")

    @property
    def vocab_size(self) -> int:
        return self.char_tokenizer.vocab_size + len(CHAT_TOKENS)

    def encode(self, text: str) -> list[int]:
        check_type("text", text, str, "decode bytes first with .decode('utf-8')")
        ids = []
        for piece in self.splitter.split(text):  # "<|user|>Hi" -> ["", "<|user|>", "Hi"]
            ids += [self.special_ids[piece]] if piece in self.special_ids else self.char_tokenizer.encode(piece)
        return ids

    def decode(self, ids) -> str:
        n = self.char_tokenizer.vocab_size
        return "".join(CHAT_TOKENS[i - n] if i >= n else self.char_tokenizer.chars[i]
                       for i in check_token_ids(ids, self.vocab_size))

# %% id="format-chat"
#| export
def format_chat(instruction: str, response: str | None = None) -> str:
    """One exchange as text: <|user|>instruction<|assistant|>response<|end|>, or, without a response, the prompt
    that asks the model for one (it ends with <|assistant|>)."""
    for name, text in (("instruction", instruction), ("response", response)):
        if text is None and name == "response":
            continue
        check_type(name, text, str, "pass the text of the turn")
        found = [token for token in CHAT_TOKENS if token in text]
        if found:
            raise ValueError(f"{name} contains the chat token {found[0]!r}: the turn's text may not hold "
                             f"{', '.join(CHAT_TOKENS)}; format_chat adds them itself")
    prompt = f"{CHAT_TOKENS[0]}{instruction}{CHAT_TOKENS[1]}"
    return prompt if response is None else f"{prompt}{response}{CHAT_TOKENS[2]}"

# %%
tokenizer = ChatTokenizer(char_tokenizer)
text = format_chat("Upper case:\nO Rome!", "O ROME!")
ids = tokenizer.encode(text)
print(repr(text))
print(ids)
assert tokenizer.decode(ids) == text and ids[0] == tokenizer.user_id and ids[-1] == tokenizer.end_id

# %% [markdown]
# ### Counting only the response
#
# The model should learn to answer, not to write instructions: a prompt is given, it is not a target. In the
# shifted sequence (inputs = tokens 0..n-2, targets = tokens 1..n-1) every target that is still part of the prompt
# becomes -100, and so does the padding that makes rows the same length. The loss is the mean over what is left:
#
# $$\mathcal{L} = -\frac{1}{|R|}\sum_{t \in R} \log p_\theta(x_{t+1} \mid x_{\le t}),$$
#
# with $R$ the positions whose next token belongs to the response (its `<|end|>` included: the model must learn
# to stop). Over a batch this is the mean over all counted tokens of all rows, as `F.cross_entropy` with
# `ignore_index` computes it, and as TRL computes it.

# %% id="chat-batch"
#| export
def chat_batch(tokenizer: ChatTokenizer, examples, context_length: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets, both (batch, tokens), for (instruction, response) pairs: each row is the exchange of
    format_chat shifted by one, padded on the right with <|end|>. A target is IGNORE_INDEX at every position whose
    next token belongs to the prompt, and on the padding: only the response and its <|end|> count in the loss."""
    check_type("tokenizer", tokenizer, ChatTokenizer, "wrap the model's tokenizer: ChatTokenizer(char_tokenizer)")
    if not isinstance(examples, (list, tuple)) or not examples:
        raise TypeError(f"examples must be a non-empty list of (instruction, response) pairs, got {examples!r}")
    check_int("context_length", context_length, minimum=1)
    rows = []
    for i, pair in enumerate(examples):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"examples[{i}] must be an (instruction, response) pair of str, got {pair!r}")
        prompt = tokenizer.encode(format_chat(pair[0]))  # <|user|> ... <|assistant|>
        full = tokenizer.encode(format_chat(*pair))  # the prompt, the response, <|end|>
        if len(full) - 1 > context_length:
            raise ValueError(f"examples[{i}] is {len(full)} tokens long, more than context_length + 1 = "
                             f"{context_length + 1}: shorten its instruction or response")
        targets = [IGNORE_INDEX] * (len(prompt) - 1) + full[len(prompt):]  # predict the response only
        rows.append((full[:-1], targets))
    width = max(len(inputs) for inputs, _ in rows)
    inputs = torch.tensor([x + [tokenizer.end_id] * (width - len(x)) for x, _ in rows])  # (batch, width)
    targets = torch.tensor([t + [IGNORE_INDEX] * (width - len(t)) for _, t in rows])  # (batch, width)
    return inputs, targets

# %% id="chat-loss"
#| export
def chat_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """The mean next-token loss over the targets that are not IGNORE_INDEX (the response tokens)."""
    check_type("inputs", inputs, Tensor, "build inputs and targets with chat_batch(...)")
    check_type("targets", targets, Tensor, "build inputs and targets with chat_batch(...)")
    if targets.shape != inputs.shape or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of the inputs' shape {tuple(inputs.shape)}, got {targets.dtype} "
                         f"{tuple(targets.shape)}: build both with chat_batch(...)")
    if targets.device.type == "cpu" and not bool((targets != IGNORE_INDEX).any()):  # the mean of nothing is NaN
        raise ValueError("every target is IGNORE_INDEX: the batch has no response token to learn")
    logits = model(inputs)  # (batch, tokens, vocab_size)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

# %% [markdown]
# A batch of three exchanges: which targets count. Each row is dark where the prompt is, bright on the response,
# dark again on the padding.

# %%
pairs = [("Upper case:\nO Rome!", "O ROME!"), ("Last word:\nIs it near day?", "day"), ("Speak as BRUTUS.", "BRUTUS:\nPeace!")]
inputs, targets = chat_batch(tokenizer, pairs, grown.cfg.context_length)  # (3, 32) each
counted = targets != IGNORE_INDEX  # (3, 26)
print("inputs", tuple(inputs.shape), "targets", tuple(targets.shape), "counted targets per row", counted.sum(1).tolist())
assert counted.sum(1).tolist() == [len(r) + 1 for _, r in pairs]  # the response and its <|end|>
fig, ax = plt.subplots(figsize=(10, 2.5))
ax.imshow(counted, cmap="viridis", aspect="auto")
ax.set_xlabel("position in the row (input token)")
ax.set_ylabel("example")
ax.set_yticks(range(3))
ax.set_title("Targets the loss counts (bright): the response and <|end|>")
plt.show()
with torch.no_grad():
    print(f"masked loss of the grown, untrained model: {chat_loss(grown, inputs, targets):.2f} nats per token")

# %% [markdown]
# ### An instruction set a program can check
#
# Exact-match accuracy needs answers that are exactly right or wrong. Four tasks made from the corpus, each from
# one or two lines of a speech:
#
# - **speaker**: two short speeches; who speaks second? (the second heading);
# - **upper**: a line rewritten in upper case;
# - **last_word**: the last word of a line, without its punctuation;
# - **continue**: "Speak as BRUTUS.": any answer is right that keeps the speaker format, the heading and then one
#   line of speech.
#
# The split is by instance and by text: training instructions come from the first 90 % of the corpus, the part
# the model was pretrained on; held-out instructions come from the last 10 %, notebook 09's validation part, and
# use no line that occurs anywhere in the first 90 %. A held-out answer cannot be recalled, only computed.

# %% id="speeches"
#| export
def speeches(text: str) -> list[tuple[str, list[str]]]:
    """The speeches of a stretch of the corpus, in order: (speaker, its lines) for every block "SPEAKER:\\nline\\n...".
    A block cut off at either end of the stretch, with no heading, is left out."""
    check_type("text", text, str, "pass the corpus text, or a part of it")
    found = []
    for block in text.split("\n\n"):
        head, colon, body = block.strip("\n").partition(":\n")
        if colon and body and "\n" not in head and head == head.upper() and head[:1].isalpha():
            found.append((head, body.split("\n")))
    return found

# %% id="last-word"
#| export
def last_word(line: str) -> str:
    """The last word of a line, without the punctuation around it ("Hail, sir!" -> "sir")."""
    words = re.findall(r"[A-Za-z][A-Za-z']*", line)
    return words[-1] if words else ""

# %% id="instruction-tasks"
#| export
INSTRUCTION_TASKS = {  # task -> (instruction, answer) from (speaker, line, the speaker and line before it)
    "speaker": lambda who, line, before, prev: (f"Who speaks second?\n{before}:\n{prev}\n\n{who}:\n{line}", who),
    "upper": lambda who, line, before, prev: (f"Upper case:\n{line}", line.upper()),
    "last_word": lambda who, line, before, prev: (f"Last word:\n{line}", last_word(line)),
    "continue": lambda who, line, before, prev: (f"Speak as {who}.", f"{who}:\n{line}"),
}

# %% id="make-instructions"
#| export
def make_instructions(text: str, per_task: int, seed: int, exclude: str = "", max_line: int = 40) -> list[dict]:
    """`per_task` instructions of each INSTRUCTION_TASKS task, drawn (seeded) from the speeches of `text`: dicts
    {"task", "instruction", "response"}. A line that occurs in `exclude` (e.g. the training text) is never used,
    so held-out answers cannot be recalled; lines are 12 to max_line characters (the speaker task's two: 8 to 28)."""
    check_type("text", text, str, "pass the corpus text, or a part of it")
    check_type("exclude", exclude, str, "pass the text whose lines may not be used, or ''")
    check_int("per_task", per_task, minimum=1)
    check_int("seed", seed)
    check_int("max_line", max_line, minimum=12)
    found = speeches(text)
    pairs = [(who, line, *prev) for (before, lines_before), (who, lines) in zip(found, found[1:])
             for line in lines for prev in [(before, lines_before[-1])] if line not in exclude]
    rng, instructions = random.Random(seed), []
    for task, make in INSTRUCTION_TASKS.items():
        short = (8, 28) if task == "speaker" else (12, max_line)
        pool = [p for p in pairs if short[0] <= len(p[1]) <= short[1] and
                (task != "speaker" or (p[0] != p[2] and short[0] <= len(p[3]) <= short[1]))]
        pool = [p for p in pool if task != "last_word" or last_word(p[1])]
        if len(pool) < per_task:
            raise ValueError(f"text has {len(pool)} usable lines for task {task!r}, fewer than per_task={per_task}: "
                             "pass a longer text or ask for fewer")
        for who, line, before, prev in rng.sample(pool, per_task):
            instruction, response = make(who, line, before, prev)
            instructions.append({"task": task, "instruction": instruction, "response": response})
    return instructions

# %% id="check-reply"
#| export
def check_reply(example: dict, reply: str) -> bool:
    """Whether `reply` answers the instruction `example` (a dict of make_instructions): the exact answer, or, for
    "continue", which has no single answer, the speaker's heading and then one line of speech."""
    check_type("example", example, dict, "pass one dict that make_instructions returned")
    check_type("reply", reply, str, "pass the model's reply, e.g. from chat_reply")
    if example.get("task") not in INSTRUCTION_TASKS or "response" not in example:
        raise ValueError(f"example must have a 'task' among {list(INSTRUCTION_TASKS)} and a 'response', got "
                         f"{sorted(example)}")
    if example["task"] == "continue":
        heading = example["response"].split("\n")[0]  # "MENENIUS:"
        return re.fullmatch(re.escape(heading) + r"\n[^\n]*[A-Za-z][^\n]*", reply) is not None
    return reply == example["response"]

# %%
text = load_shakespeare()
split = int(len(text) * 0.9)  # notebook 09's cut: one character is one token
heldout = make_instructions(text[split:], 3, 1235, exclude=text[:split])
for example in heldout[::3]:
    print(f"[{example['task']}] {example['instruction']!r} -> {example['response']!r}")
assert all(check_reply(e, e["response"]) for e in heldout)

# %% [markdown]
# ### Before fine-tuning
#
# The base model has never seen a chat token. Given the chat prompt it does what it was trained to do, and goes
# on writing a play. Its context of 128 characters leaves no room for a few-shot prompt (one example and the
# question already fill it), so the baseline is zero-shot.

# %% id="chat-reply"
#| export
def chat_reply(model: GPTModel, tokenizer: ChatTokenizer, instruction: str, max_new_tokens: int | None = None,
               temperature: float = 0.0, generator: torch.Generator | None = None) -> str:
    """The model's answer to one instruction: generate from the chat prompt until <|end|> (not included) or
    max_new_tokens (default: all the room left in the context). Greedy unless temperature > 0."""
    check_type("model", model, GPTModel, "pass the fine-tuned model")
    check_type("tokenizer", tokenizer, ChatTokenizer, "wrap the model's tokenizer: ChatTokenizer(char_tokenizer)")
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {model.cfg.vocab_size}: grow "
                         f"the model with grow_vocabulary(model, {len(CHAT_TOKENS)}) first")
    prompt = tokenizer.encode(format_chat(instruction))
    room = model.cfg.context_length - len(prompt)
    if room < 1:
        raise ValueError(f"instruction takes {len(prompt)} tokens with the chat tokens, and the context holds "
                         f"{model.cfg.context_length}: shorten it to leave room for an answer")
    if max_new_tokens is None:
        max_new_tokens = room
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    ids = torch.tensor([prompt], device=model.out_head.weight.device)  # (1, prompt tokens)
    out = generate(model, ids, min(max_new_tokens, room), temperature=temperature, eos_id=tokenizer.end_id,
                   generator=generator)[0, len(prompt):].tolist()  # the new tokens
    return tokenizer.decode(out[:out.index(tokenizer.end_id)] if tokenizer.end_id in out else out)

# %%
for example in heldout[::3]:
    reply = chat_reply(grown, tokenizer, example["instruction"], max_new_tokens=40)
    print(f"[{example['task']}] {reply!r} right: {check_reply(example, reply)}")

# %% [markdown]
# ### Fine-tuning
#
# `course_lib/data/make_shakespeare_chat.py` fine-tunes the grown model with LoRA adapters (rank 8, all six
# projections of every block) and trains the new rows with them, on 6,000 training instructions, with
# `chat_batch` and `chat_loss`. It runs longer than a notebook may, so the course ships its result. A few steps
# here show the loop; the shipped run is the same loop, longer.

# %%
torch.manual_seed(123)
student = grow_vocabulary(base, len(CHAT_TOKENS))
apply_lora(student, ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"], r=8, alpha=16)
new_rows = train_new_rows(student, char_tokenizer.vocab_size)
optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
train = make_instructions(text[:split], 16, 0)
losses = []
student.train()
for step in range(4):
    batch = [(e["instruction"], e["response"]) for e in train[16 * step:16 * step + 16]]
    loss = chat_loss(student, *chat_batch(tokenizer, batch, student.cfg.context_length))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
student.eval()
assert losses[-1] < losses[0] and torch.equal(new_rows[1][:65], base.out_head.weight)
print("4 steps: the masked loss falls below its first value; the old head rows are unchanged")

# %% [markdown]
# What fine-tuning changed, and so what ships, is the adapters and the new rows: not a copy of the model.

# %% id="new-rows"
#| export
NEW_ROWS = ("embedding.tok_emb.new_rows", "out_head.new_rows")  # what a chat adapter adds to lora_state_dict

# %% id="chat-state-dict"
#| export
def chat_state_dict(model: GPTModel, first_new: int) -> dict[str, Tensor]:
    """What fine-tuning for chat changed, and nothing else: the LoRA adapters and the rows of the token embedding
    and of the output head from first_new on (the chat tokens), as detached copies."""
    state = lora_state_dict(model)  # also checks that the model has adapters
    check_int("first_new", first_new, minimum=1)
    if first_new >= model.cfg.vocab_size:
        raise ValueError(f"first_new is {first_new}, but the vocabulary has {model.cfg.vocab_size} tokens: pass the "
                         "old vocabulary size")
    for key, weight in zip(NEW_ROWS, (model.embedding.tok_emb.weight, model.out_head.weight)):
        state[key] = weight[first_new:].detach().clone()  # (new tokens, emb_dim)
    return state

# %% id="load-shakespeare-chat"
#| export
SHAKESPEARE_CHAT_DIR = DATA_DIR / "shakespeare_chat"  # written by course_lib/data/make_shakespeare_chat.py


def load_shakespeare_chat(device: str | torch.device | None = None) -> tuple[GPTModel, ChatTokenizer]:
    """The shipped Shakespeare model, grown by the chat tokens and given the shipped chat adapter (eval mode, on
    `device`), and its ChatTokenizer. Only adapter.safetensors and chat.json are stored, not a second model."""
    settings = json.loads((SHAKESPEARE_CHAT_DIR / "chat.json").read_text(encoding="utf-8"))
    base, char_tokenizer = load_shakespeare_gpt(device)
    model = grow_vocabulary(base, len(CHAT_TOKENS))
    apply_lora(model, settings["targets"], settings["r"], settings["alpha"])
    state = load_file(SHAKESPEARE_CHAT_DIR / "adapter.safetensors", device=str(model.out_head.weight.device))
    rows = [state.pop(key) for key in NEW_ROWS]
    load_lora_state_dict(model, state)
    first_new = char_tokenizer.vocab_size
    with torch.no_grad():
        model.embedding.tok_emb.weight[first_new:] = rows[0]
        model.out_head.weight[first_new:] = rows[1]
    return model.eval(), ChatTokenizer(char_tokenizer)

# %%
chat_model, tokenizer = load_shakespeare_chat()
card = json.loads((SHAKESPEARE_CHAT_DIR / "card.json").read_text(encoding="utf-8"))
shipped = sum(f.stat().st_size for f in SHAKESPEARE_CHAT_DIR.iterdir())
print(f"shipped: {shipped / 1e6:.2f} MB for {card['trainable']:,} trained numbers (the base model: 12.9 MB)")
for example in heldout[::3]:
    reply = chat_reply(chat_model, tokenizer, example["instruction"])
    print(f"[{example['task']}] {reply!r} right: {check_reply(example, reply)}")

# %% [markdown]
# The card records exact match on all held-out instructions, measured by the script: the base model with a plain
# zero-shot prompt, the grown model with the chat prompt before training, and the fine-tuned model.

# %%
acc = card["exact_match"]
tasks = [*INSTRUCTION_TASKS, "all"]
fig, ax = plt.subplots(figsize=(9, 4))
for k, (key, label) in enumerate([("base_plain", "base, plain prompt"), ("grown_chat", "grown, chat prompt"),
                                  ("fine_tuned", "fine-tuned")]):
    ax.bar([i + 0.27 * (k - 1) for i in range(len(tasks))], [acc[key][t] for t in tasks], width=0.27, label=label)
ax.set_xticks(range(len(tasks)), tasks)
ax.set_ylabel("held-out exact match")
ax.set_ylim(0, 1)
ax.set_title(f"{card['instructions']['heldout']} held-out instructions, from text the model never trained on")
ax.legend(loc="upper left")
plt.show()
assert acc["fine_tuned"]["all"] > acc["base_plain"]["all"]
print({t: f"{acc['base_plain'][t]:.0%} -> {acc['fine_tuned'][t]:.0%}" for t in tasks})

# %% [markdown]
# ### A chat loop
#
# `chat_loop` reads a message, answers with `chat_reply`, and stops at an empty message. `generate` stops each
# reply at `<|end|>`, the end of the model's turn, instead of running to the end of the context. Here the messages
# come from a list; in a terminal, leave `read` at its default, `input`.

# %% id="chat-loop"
#| export
def chat_loop(model: GPTModel, tokenizer: ChatTokenizer, read=input, write=print, **sampling) -> list[tuple[str, str]]:
    """Read a message, write the model's reply, until an empty message; returns the exchanges. Each turn is a
    conversation of its own: a context of 128 characters holds one exchange, not a history. `read` and `write`
    default to the keyboard and the screen; `sampling` goes to chat_reply (temperature, generator)."""
    if not (callable(read) and callable(write)):
        raise TypeError("read and write must be callables, like input and print")
    exchanges = []
    while (message := read("you: ")).strip():
        reply = chat_reply(model, tokenizer, message, **sampling)
        write(f"model: {reply}")
        exchanges.append((message, reply))
    return exchanges

# %%
messages = iter(["Upper case:\nThe gods are kind.", "Speak as VOLUMNIA.", ""])
exchanges = chat_loop(chat_model, tokenizer, read=lambda prompt: next(messages))
assert len(exchanges) == 2

# %% [markdown]
# ### Exercise 2: a fifth task
#
# *Medium, about 30 minutes.* Add a task "first word" (the first word of a line) to a copy of
# `INSTRUCTION_TASKS`, make 200 training instructions for it, and train the shipped chat model's adapters on them
# for 50 steps (mix in the old tasks so it does not forget them). Measure exact match on 20 held-out instructions
# of the new task before and after. Which is easier for the model, the first word or the last, and why might a
# model that reads left to right find one easier?
#
# ### Exercise 3: a random start for the new rows
#
# *Short, about 15 minutes.* Grow the base model with new rows drawn from N(0, 0.02) instead of the mean, and
# compare the probability the new tokens get on a line of Shakespeare, before any training. Which start disturbs
# the model less?
#
# ### Summary
#
# `course_lib.finetuning` gained the chat format (`CHAT_TOKENS`, `ChatTokenizer`, `format_chat`), vocabulary
# growth that keeps the old model (`grow_vocabulary`, `train_new_rows`), the masked loss (`chat_batch`,
# `chat_loss`, `IGNORE_INDEX`), an instruction set with checkable answers (`make_instructions`, `check_reply`),
# replies that stop at `<|end|>` (`chat_reply`, `chat_loop`), and the shipped chat adapter
# (`chat_state_dict`, `load_shakespeare_chat`).
