"""Hugging Face transformers baseline: ``generate`` in float32 on the GGUF's weights (dequantized)."""

from __future__ import annotations

import time
from pathlib import Path


def load(gguf_path: str, threads: int):
    """``(model, tokenizer)`` from the GGUF file, float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    path = Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tokenizer


def float32_checkpoint(gguf_path: str, cache: Path) -> Path:
    """A Hugging Face directory (safetensors, float32) of the GGUF's dequantized weights, made once.

    The engine keeps GGUF weights quantized wherever its kernels can; this is the input
    that makes it run the same model in plain float32 (the bench's ``fp32`` configuration).
    """
    path = Path(gguf_path)
    out = cache / f"fp32-{path.stem}"
    if not (out / "model.safetensors").exists():
        import json

        from safetensors.torch import save_file

        model, tokenizer = load(gguf_path, threads=1)
        tmp = out.with_name(out.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        # transformers refuses save_pretrained on a GGUF-loaded model: write the parts directly
        config = model.config.to_dict()
        weights = {name: t.contiguous() for name, t in model.state_dict().items()}
        if config.get("tie_word_embeddings"):
            weights.pop("lm_head.weight", None)  # tied: stored once, as the embedding
        save_file(weights, str(tmp / "model.safetensors"))
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]  # None after a GGUF load
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    return out


def _generate_time(model, input_ids, new_tokens: int) -> float:
    import torch

    mask = torch.ones_like(input_ids)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    if out.shape[1] - input_ids.shape[1] != new_tokens:
        raise RuntimeError(f"generate made {out.shape[1] - input_ids.shape[1]} tokens, asked for {new_tokens}")
    return elapsed


def decode_tok_s(model, prompt_ids: list[int], n_gen: int) -> float:
    """Batch-1 decode rate: ``n_gen`` tokens after the first, over the time since the first.

    A logits processor stamps every step (each runs right after a forward pass); best of two.
    """
    import torch
    from transformers import LogitsProcessorList

    stamps: list[float] = []

    def stamp(input_ids, scores):
        stamps.append(time.perf_counter())
        return scores

    ids, best = torch.tensor([prompt_ids]), 0.0
    _generate_time(model, ids, 2)  # warm-up
    for _ in range(2):
        stamps.clear()
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_gen + 1, min_new_tokens=n_gen + 1,
                do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([stamp]),
            )  # fmt: skip
        if len(stamps) != n_gen + 1:
            raise RuntimeError(f"expected {n_gen + 1} token steps, stamped {len(stamps)}")
        best = max(best, n_gen / (stamps[-1] - stamps[0]))
    return best


def batched_gen_tok_s(model, prompts: list[list[int]], n_gen: int) -> dict[str, float]:
    """All prompts (equal lengths, no padding) in one ``generate`` batch: generated tok/s incl. prefill."""
    import torch

    ids = torch.tensor(prompts)
    elapsed = _generate_time(model, ids, n_gen)
    return {"elapsed_s": elapsed, "output_tok_s": len(prompts) * n_gen / elapsed}
