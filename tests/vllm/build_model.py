"""Build the real-vLLM tier's tiny model into a folder (argv[1]); run by the vLLM venv's python.

No weights can be downloaded, so the model is made here: a Llama config (2 layers, hidden 256,
vocab 4,096, 4,096 positions) with seeded random bf16 weights, a byte-level BPE tokenizer trained
on a seeded synthetic corpus (any text encodes, nothing is unknown), and a chat template that
renders system, user, assistant (with ``tool_calls``) and tool messages and the request's
``tools``. The output is gibberish; the tier only needs tokens, KV blocks and counters.
"""

from __future__ import annotations

import random
import string
import sys
from pathlib import Path

VOCAB = 4096
SEED = 20261205

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools %}<|tools|>{{ tools | tojson }}<|/tools|>\n{% endif %}"
    "{%- for message in messages %}<|{{ message.role }}|>"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}"
    "{%- if message.tool_calls %}{% for call in message.tool_calls %}<|call|>"
    "{{ call.id }} {{ call.function.name }} "
    "{%- if call.function.arguments is string %}{{ call.function.arguments }}"
    "{%- else %}{{ call.function.arguments | tojson }}{% endif %}{% endfor %}{% endif %}"
    "{%- if message.tool_call_id %}<|result|>{{ message.tool_call_id }}{% endif %}<|end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|tools|>",
           "<|/tools|>", "<|call|>", "<|result|>", "<|end|>"]  # fmt: skip


def corpus(rng: random.Random) -> list[str]:
    alphabet = string.ascii_lowercase + string.digits + '{}[]":,_ '
    words = ["the", "weather", "tool", "call", "function", "arguments", "city", "result",
             "probe", "user", "assistant", "system", "name", "type", "object", "string"]  # fmt: skip
    lines = []
    for _ in range(20_000):
        parts = [rng.choice(words) if rng.random() < 0.5 else
                 "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))
                 for _ in range(rng.randint(4, 16))]  # fmt: skip
        lines.append(" ".join(parts))
    return lines


def build(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(SEED)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator(corpus(rng), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
