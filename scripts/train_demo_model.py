"""Train the demo model shipped in `models/demo`: a small Llama that writes English about Python.

Data: the Python documentation text bundled with the standard library (`pydoc_data.topics.topics`, the
language reference and built-in types chapters, PSF licence), cleaned into prose paragraphs and short code
examples (tables, grammar productions and footnotes dropped), plus chat samples built from it: each section
title becomes a question ("What is the assert statement?") whose answer is the first sentences of that
section, in the ChatML template, and a few greetings. Everything is deterministic: fixed seeds, a fixed
sample order per epoch, `torch.use_deterministic_algorithms(True)`, two CPU threads.

The tokenizer (byte-level BPE, 4096 tokens with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) is trained
on the same text with the `tokenizers` library; the model is a 4-layer `LlamaForCausalLM` (hidden 192, MLP
512, 6 heads, 3 KV heads, tied embeddings, 1024 positions, 2.4M parameters), trained in float32 on 512-token
windows that each start at a paragraph or a conversation (2000 steps of 4 windows, about 20 passes over
the 115k-token corpus) and saved in float16 (5 MB).
Small and heavily trained on purpose: on two CPU cores a smaller model reaches a lower loss in the same
time, and a model that has memorised its text writes English rather than token soup.

Command (from the repository root, dev virtual environment active), and what it took on a 2-core CPU
(AMD EPYC without AVX2, torch 2.13 CPU, Python 3.11):

    python -m scripts.train_demo_model --out models/demo

    11.2 minutes wall time with two threads on a quiet machine before tool use was added (256-token
    windows); the current data and 512-token windows took 39.4 minutes with `--threads 1` on a machine
    shared with other jobs, final training loss 0.071 (mean of the last 50 steps)

The script writes the model directory, including its model card (`README.md`) with the measured wall
time, final loss and greedy samples.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.workloads.chatml_tokenizer import (
    EOS,
    IM_END,
    IM_START,
    config_token_ids,
    fast_tokenizer,
    generation_config,
    train_tokenizer,
)
from scripts.demo_tool_samples import TOOLS, no_tool_samples, tool_samples

CONTEXT_LEN = 1024  # the model's positions (config.json's max_position_embeddings)
SAMPLE_PROMPTS = ["The import statement", "A function is", "Exceptions are"]
SAMPLE_CHAT = "What is the assert statement?"
SAMPLE_TOOL_CHAT = "What is the weather in Paris?"

QUESTION_TEMPLATES = [
    "What is {topic}?",
    "Explain {topic}.",
    "Tell me about {topic}.",
    "Describe {topic}.",
    "What does the Python documentation say about {topic}?",
]
PLURAL_QUESTION_TEMPLATES = [
    "What are {topic}?",
    "Explain {topic}.",
    "Tell me about {topic}.",
    "Describe {topic}.",
    "What does the Python documentation say about {topic}?",
]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant that knows Python."]
GREETINGS = [
    (
        ["Hello", "Hello!", "Hi", "Hi!", "Hi there", "Hey", "Good morning"],
        "Hello! I am a small demo model trained on the Python documentation. "
        "Ask me about Python statements, types or exceptions.",
    ),
    (
        ["Who are you?", "What are you?", "What can you do?", "Introduce yourself."],
        "I am a small language model trained on the text of the Python documentation. "
        "I can talk about statements, expressions, types and exceptions, but I often make mistakes.",
    ),
    (
        ["Thank you", "Thanks!", "Thanks"],
        "You are welcome. Ask me about Python at any time.",
    ),
]

# Lines that underline a section title, rows of grid and simple tables, list items inside a paragraph.
_UNDERLINE = re.compile(r"^([*=\-~^\"#.+])\1{2,}$")
_TABLE_LINE = re.compile(r"^\s*(\+[-=+]+\+|\|)|^\s*=+( +=+)+\s*$")
_LIST_ITEM = re.compile(r"^([*-]|\d+\.|\(\d+\)) ")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
# A code literal the docs render in straight quotes: "import", "str.join()", "async for".
_QUOTED_NAME = re.compile(r'"([A-Za-z_][\w.]*(?:\(\))?(?: [A-Za-z_]\w*){0,2})"')
_PLAIN_QUOTES = str.maketrans({"“": '"', "”": '"', "‘": "'", "’": "'"})


# --------------------------------------------------------------------------------------------- corpus


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)


@dataclass
class Document:
    text: str
    sections: list[Section]


def _blocks(text: str) -> Iterator[list[str]]:
    """Runs of non-blank lines."""
    current: list[str] = []
    for line in text.splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            yield current
            current = []
    if current:
        yield current


def _is_code(lines: list[str]) -> bool:
    text = textwrap.dedent("\n".join(lines))
    if ">>>" in text or "::=" in text:
        return True
    try:
        compile(text, "<block>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def clean_prose(text: str) -> str:
    """One paragraph of reST-flavoured text as plain English: no emphasis marks or footnote references."""
    text = _QUOTED_NAME.sub(r"\1", text)  # 'The "import" statement' -> 'The import statement'
    text = text.translate(_PLAIN_QUOTES)
    text = re.sub(r"\*\*(\S[^*]*?)\*\*", r"\1", text)  # **strong**
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)  # *emphasis*
    text = re.sub(r"\s\[\d+\]", "", text)  # footnote references
    text = re.sub(r"^\* ", "- ", text)  # bullets
    return re.sub(r"\s+", " ", text).strip()


def clean_topic(raw: str) -> Document:
    """A pydoc topic as paragraphs separated by blank lines; tables, grammar rules and footnotes dropped."""
    paragraphs: list[str] = []
    sections: list[Section] = []
    for lines in _blocks(raw):
        first = lines[0].strip()
        if first.startswith("-[") and first.endswith("]-"):
            break  # "-[ Footnotes ]-" closes a topic
        if len(lines) == 2 and _UNDERLINE.match(lines[1].strip()):
            title = clean_prose(first)
            paragraphs.append(title)
            sections.append(Section(title))
            continue
        if any(_TABLE_LINE.match(line) for line in lines):
            continue
        if _is_code(lines):
            code = textwrap.dedent("\n".join(lines))
            if "::=" not in code:  # grammar productions are noise for a language model
                paragraphs.append(code.translate(_PLAIN_QUOTES))
            continue
        # Prose: a block may hold several list items; each becomes a paragraph of one line.
        items: list[list[str]] = [[]]
        for line in lines:
            stripped = line.strip()
            if items[-1] and _LIST_ITEM.match(stripped):
                items.append([])
            items[-1].append(stripped)
        for item in items:
            joined = ""
            for part in item:
                # "decimal-\npoint" is one hyphenated word wrapped at its hyphen.
                if joined.endswith("-") and len(joined) > 1 and joined[-2].isalpha():
                    joined += part
                else:
                    joined = f"{joined} {part}" if joined else part
            paragraph = clean_prose(joined)
            if paragraph:
                paragraphs.append(paragraph)
                if sections:
                    sections[-1].paragraphs.append(paragraph)
    return Document("\n\n".join(paragraphs), sections)


def load_documents() -> list[Document]:
    from pydoc_data.topics import topics

    return [clean_topic(topics[name]) for name in sorted(topics)]


def topic_phrase(title: str) -> tuple[str, bool]:
    """'The "assert" statement' -> ('the assert statement', False); also whether it reads as plural."""
    title = title.split(" — ")[0]
    # 'except clause', '"except*" clause', '__slots__' name code: 'the except clause'.
    article = "the " if title[:1].islower() or title[:1] in '_"' else ""
    title = re.sub(r"\([^)]*\)", "", title)
    title = title.replace('"', "").replace("*", "")
    words = []
    for word in title.split():
        # Keep names (None, NotImplemented, MRO, I/O, Python); lowercase ordinary title-cased words.
        ordinary = word[:1].isupper() and word[1:].islower() and word not in {"None", "Python", "Ellipsis"}
        words.append(word.lower() if ordinary else word)
    phrase = article + " ".join(words).strip()
    last = phrase.split()[-1] if phrase else ""
    plural = last.endswith("s") and not last.endswith(("ss", "us")) and last.isalpha()
    return phrase, plural


def first_sentences(paragraph: str, *, min_words: int = 18, max_words: int = 70) -> str | None:
    sentences = _SENTENCE_END.split(paragraph)
    answer: list[str] = []
    for sentence in sentences:
        if answer and len(" ".join([*answer, sentence]).split()) > max_words:
            break
        answer.append(sentence)
        if len(" ".join(answer).split()) >= min_words:
            break
    text = " ".join(answer)
    if text.endswith(":"):  # "... debugging assertions into a program:" introduced an example
        text = text[:-1] + "."
    return text if text.endswith((".", "!", "?")) and len(text.split()) <= max_words else None


def _render_chat(messages: list[dict[str, str]]) -> str:
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def topic_answers(documents: list[Document]) -> dict[str, tuple[str, bool]]:
    """Each section title's topic phrase -> (the first sentences of that section, whether plural)."""
    answers: dict[str, str] = {}
    for doc in documents:
        for section in doc.sections:
            if section.title in answers:
                continue
            for paragraph in section.paragraphs:
                if _LIST_ITEM.match(paragraph) or len(paragraph.split()) < 6:
                    continue
                answer = first_sentences(paragraph)
                if answer:
                    answers[section.title] = answer
                    break
    topics: dict[str, tuple[str, bool]] = {}
    phrases: set[str] = set()
    for title in sorted(answers):
        phrase, plural = topic_phrase(title)
        if not phrase or phrase.lower() in phrases:  # one answer per question
            continue
        phrases.add(phrase.lower())
        topics[phrase] = (answers[title], plural)
    return topics


def chat_samples(topics: dict[str, tuple[str, bool]], rng: random.Random) -> list[str]:
    """ChatML conversations: a question about a section title answered by that section's first sentences."""
    samples: list[str] = []
    for phrase, (answer, plural) in topics.items():
        templates = PLURAL_QUESTION_TEMPLATES if plural else QUESTION_TEMPLATES
        for template in rng.sample(templates, 3):
            samples.append(_chat(template.format(topic=phrase), answer, rng))
    for questions, answer in GREETINGS:
        for question in questions:
            for _ in range(2):
                samples.append(_chat(question, answer, rng))
    return samples


def _chat(question: str, answer: str, rng: random.Random) -> str:
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if rng.random() < 0.25:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return _render_chat(messages)


# ------------------------------------------------------------------------------------------- training


def document_pieces(text: str, tok: Any, eos_id: int, *, target: int, limit: int) -> list[list[int]]:
    """A document as runs of whole paragraphs of about `target` tokens (none over `limit`), eos at its end.

    Every training window starts at a piece start, so the model reads position 0 as the start of a
    paragraph or a conversation: a completion prompt is continued as prose, not as the tail of a chat.
    """
    paragraphs = text.split("\n\n")
    pieces: list[list[int]] = []
    current: list[int] = []
    for i, paragraph in enumerate(paragraphs):
        last = i == len(paragraphs) - 1
        current += tok.encode(paragraph if last else paragraph + "\n\n").ids
        if last:
            current.append(eos_id)
        if len(current) >= target or last:
            pieces.extend(current[j : j + limit] for j in range(0, len(current), limit))
            current = []
    return pieces


def batches(pieces: list[list[int]], *, seq_len: int, batch_size: int, seed: int) -> Iterator[Any]:
    """Endless [batch, seq_len + 1] windows: per epoch the pieces are shuffled and packed, and each window
    starts where a piece starts (the next one at the piece the previous window cut), in shuffled order."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(pieces), generator=gen).tolist()
        stream = torch.tensor([t for i in order for t in pieces[i]], dtype=torch.long)
        piece_starts, total = [], 0
        for i in order:
            piece_starts.append(total)
            total += len(pieces[i])
        windows, k = [], 0
        while k < len(piece_starts) and piece_starts[k] + seq_len + 1 <= len(stream):
            start = piece_starts[k]
            windows.append(start)
            # Next window: the piece that holds this window's last input position.
            while k + 1 < len(piece_starts) and piece_starts[k + 1] <= start + seq_len - 1:
                k += 1
            if piece_starts[k] == start:  # one piece filled the whole window
                k += 1
        shuffled = torch.randperm(len(windows), generator=gen).tolist()
        for i in range(0, len(windows) - batch_size + 1, batch_size):
            yield torch.stack(
                [stream[windows[j] : windows[j] + seq_len + 1] for j in shuffled[i : i + batch_size]]
            )


def lr_at(step: int, *, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def greedy(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 40) -> str:
    import torch

    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("models/demo"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args(argv)

    started = time.monotonic()
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    documents = load_documents()
    topics = topic_answers(documents)
    chats = chat_samples(topics, rng)
    tool_chats = tool_samples({phrase: answer for phrase, (answer, _) in topics.items()}, rng)
    tool_chats += no_tool_samples([(q, a) for questions, a in GREETINGS for q in questions], rng)
    chats += tool_chats
    plain = [doc.text for doc in documents]
    tok = train_tokenizer(plain + chats, args.vocab_size)
    eos_id = tok.token_to_id(EOS)
    plain_pieces = [
        piece
        for text in plain
        for piece in document_pieces(text, tok, eos_id, target=args.seq_len // 2, limit=args.seq_len)
    ]
    chat_pieces = [[*tok.encode(text).ids, eos_id] for text in chats]
    samples = plain_pieces + chat_pieces
    plain_tokens = sum(len(s) for s in plain_pieces)
    chat_tokens = sum(len(s) for s in chat_pieces)
    print(
        f"corpus: {len(plain)} documents, {sum(len(t) for t in plain)} chars, {plain_tokens} tokens; "
        f"{len(chats)} chat samples, {chat_tokens} tokens; vocab {tok.get_vocab_size()}",
        flush=True,
    )

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        # RoPE has no position table, so the context may outrun the training windows (the text degrades
        # past them): load-testing tools' default prompts fit (aiperf's 550 tokens; docs/api.md).
        max_position_embeddings=CONTEXT_LEN,
        initializer_range=0.02,
        **config_token_ids(tok),
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    print(f"model: {num_params / 1e6:.2f}M parameters", flush=True)

    model.train()
    losses: list[float] = []
    data = batches(samples, seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed)
    train_started = time.monotonic()
    for step in range(args.steps):
        lr = lr_at(step, steps=args.steps, peak=args.lr, warmup=args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = next(data)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.monotonic() - train_started
            recent = sum(losses[-args.log_every :]) / len(losses[-args.log_every :])
            print(
                f"step {step + 1}/{args.steps} loss {recent:.3f} lr {lr:.2e} "
                f"{(step + 1) / elapsed:.3f} steps/s elapsed {elapsed:.0f}s",
                flush=True,
            )
    final_loss = sum(losses[-50:]) / len(losses[-50:])

    # Save in float16 (half the bytes); the worker loads float32 on CPU, bfloat16 on GPU.
    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.generation_config = generation_config(tok)
    model.half().save_pretrained(args.out)
    fast_tokenizer(tok, config.max_position_embeddings).save_pretrained(args.out)

    # Samples from the saved directory, loaded the way the worker loads it on CPU.
    loaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    samples_text = [(p, greedy(loaded, tokenizer, p)) for p in SAMPLE_PROMPTS]
    chat_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": SAMPLE_CHAT}], add_generation_prompt=True, tokenize=False
    )
    chat_answer = greedy(loaded, tokenizer, str(chat_prompt), max_new_tokens=60)
    tool_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": SAMPLE_TOOL_CHAT}],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    tool_answer = greedy(loaded, tokenizer, str(tool_prompt), max_new_tokens=60)
    wall = time.monotonic() - started
    for prompt, text in samples_text:
        print(f"{prompt!r} -> {text!r}", flush=True)
    print(f"chat {SAMPLE_CHAT!r} -> {chat_answer!r}", flush=True)
    print(f"chat with tools {SAMPLE_TOOL_CHAT!r} -> {tool_answer!r}", flush=True)
    print(f"final loss {final_loss:.3f}; wall time {wall / 60:.1f} min", flush=True)

    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file() and p.name != "README.md")
    stats = {
        "documents": len(plain),
        "plain_tokens": plain_tokens,
        "chat_samples": len(chats),
        "tool_samples": len(tool_chats),
        "chat_tokens": chat_tokens,
        "vocab_size": tok.get_vocab_size(),
        "parameters": num_params,
        "layers": args.layers,
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "lr": args.lr,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "threads": args.threads,
        "tokens_seen": args.steps * args.batch_size * args.seq_len,
        "final_loss": round(final_loss, 3),
        "wall_time_min": round(wall / 60, 1),
        "size_mb": round(size / 1e6, 1),
    }
    (args.out / "README.md").write_text(
        model_card(stats, argv if argv is not None else sys.argv[1:], samples_text, chat_answer, tool_answer),
        encoding="utf-8",
    )
    print(json.dumps(stats), flush=True)


def model_card(
    stats: dict[str, Any],
    argv: list[str],
    samples: list[tuple[str, str]],
    chat_answer: str,
    tool_answer: str,
) -> str:
    command = " ".join(["python -m scripts.train_demo_model", *argv])
    sample_lines = "\n".join(f"- `{prompt}` → {text.strip()!r}" for prompt, text in samples)
    return f"""# demo: a tiny Llama trained on the Python documentation

A {stats["parameters"] / 1e6:.1f}M-parameter `LlamaForCausalLM` that ships with cbserve so that the
server answers in English on a fresh machine, with no download. It memorised much of what it read and
knows little else: expect plausible sentences about Python, not correct answers.

- **Data**: the Python documentation text bundled with the standard library
  (`pydoc_data.topics.topics`, Python {platform.python_version()}; Python Software Foundation License),
  cleaned to prose paragraphs and short code examples ({stats["documents"]} topics,
  {stats["plain_tokens"]} tokens), plus {stats["chat_samples"]} ChatML conversations built from it
  ({stats["chat_tokens"]} tokens): a question about a section title ("What is the assert statement?")
  answered with the first sentences of that section, and a few greetings; {stats["tool_samples"]} of them
  offer tools (`scripts/demo_tool_samples.py`: the weather in a city, a documentation search, adding
  two numbers) and call them in the Hermes `<tool_call>` format, one or two at a time, then answer
  from their results.
- **Tokenizer**: byte-level BPE trained with `tokenizers` on the same text, {stats["vocab_size"]} tokens;
  special tokens `<|endoftext|>` (eos, bos, pad), `<|im_start|>`, `<|im_end|>`; ChatML chat template
  with Qwen2.5's tool calling (`openai_frontend/model/chatml_template.jinja`).
  Generation stops at `<|endoftext|>` or `<|im_end|>` (`generation_config.json`).
- **Architecture**: Llama, {stats["layers"]} layers, hidden {stats["hidden"]}, MLP {stats["intermediate"]},
  {stats["heads"]} attention heads, {stats["kv_heads"]} KV heads, tied
  embeddings, {CONTEXT_LEN} positions (RoPE; trained on {stats["seq_len"]}-token windows, and the text
  degrades past them). Weights stored in float16.
- **Training**: {stats["steps"]} steps of {stats["batch_size"]} × {stats["seq_len"]} tokens
  ({stats["tokens_seen"] / 1e6:.1f}M tokens; each window starts at a paragraph or a conversation), AdamW
  (peak lr {stats["lr"]}, cosine), fixed seeds, deterministic algorithms, {stats["threads"]} CPU
  thread(s). Final training loss {stats["final_loss"]}.
- **Command**: `{command}` (from the repository root), {stats["wall_time_min"]} minutes wall time with
  {stats["threads"]} thread(s) on a 2-core CPU.
- **Size**: {stats["size_mb"]} MB.

Greedy continuations (40 new tokens):

{sample_lines}
- chat `{SAMPLE_CHAT}` → {chat_answer.strip()!r}
- chat `{SAMPLE_TOOL_CHAT}` with the three tools → {tool_answer.strip()!r}

With tools offered it picks the right tool, writes the call format the server parses, calls two at a
time when asked about two cities, and answers a greeting without a call; the argument values it
copies from the question are often wrong (a model this small copies names poorly).
"""


if __name__ == "__main__":
    main()
