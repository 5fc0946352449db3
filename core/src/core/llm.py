"""The offline API, vLLM's way: ``LLM(...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import Any

from plugins import Platform
from tqdm.auto import tqdm

from core.config import EngineConfig
from core.lora import LoRARequest
from core.outputs import RequestOutput
from core.pooling import make_engine
from core.pooling.offline import PoolingAPI
from core.sampling_params import SamplingParams


class LLM(PoolingAPI):
    """An engine for offline batch generation, or pooling (``embed``, ``score``, ``classify``, ``encode``).

    :param model: HF model directory, ``.gguf`` file or hub id; None = the default model.
    :param device: ``"auto"``, a plugin name, or a :class:`plugins.Platform` (class or instance).
    :param skip_tokenizer_init: run without a tokenizer (prompts as token ids only).
    :param engine_kwargs: any :class:`core.config.EngineConfig` field (``dtype``,
        ``max_model_len``, ``max_num_seqs``, ``block_size``, ``enable_prefix_caching``,
        ``kv_cache_bytes``, ``kv_cache_dtype``, ``quantization``, ``seed``, ``tensor_parallel_size``,
        ``distributed_executor_backend``, ``enable_lora``, ``max_loras``, ``max_lora_rank``, ...).
    """

    def __init__(
        self,
        model: str | None = None,
        device: str | Platform | type[Platform] = "auto",
        skip_tokenizer_init: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        config = EngineConfig(model=model, device=device, **engine_kwargs)
        if config.data_parallel_size != 1:
            raise ValueError(
                f"data_parallel_size={config.data_parallel_size}: LLM runs one engine; "
                "serve replicas with core serve --data-parallel-size"
            )
        self.engine = make_engine(config, skip_tokenizer_init=skip_tokenizer_init)
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Seq[str] | None = None,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        prompt_token_ids: Seq[Seq[int]] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt (text or token ids); outputs in input order.

        ``lora_request``: the LoRA adapter of every prompt, or a list with one (or None) per prompt
        (the engine needs ``enable_lora=True``)."""
        if prompts is not None and prompt_token_ids is not None:
            raise ValueError("pass prompts or prompt_token_ids, not both")
        if isinstance(prompts, str):
            prompts = [prompts]
        items: list[tuple[str | None, list[int] | None]]
        if prompt_token_ids is not None:
            items = [(None, list(ids)) for ids in prompt_token_ids]
        elif prompts is not None:
            wrong = next((p for p in prompts if not isinstance(p, str)), None)
            if wrong is not None:
                raise TypeError(
                    f"prompts are strings, got {type(wrong).__name__} {str(wrong)[:40]}; "
                    "pass token ids as prompt_token_ids=[[...], ...]"
                )
            items = [(p, None) for p in prompts]
        else:
            raise ValueError("generate() needs prompts or prompt_token_ids")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise ValueError(f"got {len(params_list)} sampling params for {len(items)} prompts")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(items)
        else:
            loras = list(lora_request)
            if len(loras) != len(items):
                raise ValueError(f"got {len(loras)} LoRA requests for {len(items)} prompts")
        order = []
        for (text, ids), params, lora in zip(items, params_list, loras, strict=False):
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, prompt=text, params=params, prompt_token_ids=ids, lora_request=lora)
            order.append(request_id)
        return self._run(order, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, with the model's chat template
        (``lora_request`` as for :meth:`generate`)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.engine.apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, chat_template=chat_template
            )
            for conv in conversations
        ]
        return self.generate(
            prompt_token_ids=prompts, sampling_params=sampling_params, use_tqdm=use_tqdm, lora_request=lora_request
        )

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm, unit="req")
        generated = 0
        start = bar.format_dict["elapsed"]
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    finished[out.request_id] = out
                    generated += sum(len(c.token_ids) for c in out.outputs)
                    bar.update(1)
                    elapsed = bar.format_dict["elapsed"] - start
                    if elapsed > 0:
                        bar.set_postfix_str(f"output {generated / elapsed:.1f} tok/s")
        bar.close()
        return [finished[request_id] for request_id in order]

    def shutdown(self) -> None:
        """Release the engine's KV cache and model (and stop its workers)."""
        if self.engine is not None:
            self.engine.shutdown()
        self.engine = None  # type: ignore[assignment]
