"""LoRA adapters through ``core serve``: ``--lora-modules``, ``model: <adapter>``, ``/v1/models``, and
runtime ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (CORE_ALLOW_RUNTIME_LORA_UPDATING)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from core.bench.parity import hf_greedy
from peft import LoraConfig, get_peft_model

MODEL = "tiny"
PROMPT = [5, 17, 200, 3, 77]
MAX_TOKENS = 8


def make_adapter(hf, directory, rank, modules, seed):
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules, init_lora_weights=False)
    peft_model = get_peft_model(hf, config).eval()
    peft_model.save_pretrained(directory)
    tokens = hf_greedy(peft_model, PROMPT, MAX_TOKENS)[0]
    return peft_model.unload(), tokens


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    """Two adapters of rank 8 and one of rank 16, with transformers + peft's greedy text after PROMPT."""
    root = tmp_path_factory.mktemp("server-lora")
    decode = transformers.AutoTokenizer.from_pretrained(tiny_llama).decode
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    expected = {"base": hf_greedy(hf, PROMPT, MAX_TOKENS)[0]}
    hf, expected["sql"] = make_adapter(hf, root / "sql", 8, ["q_proj", "v_proj", "down_proj"], 1)
    hf, expected["chat"] = make_adapter(hf, root / "chat", 8, ["k_proj", "o_proj", "gate_proj", "up_proj"], 2)
    make_adapter(hf, root / "wide", 16, ["q_proj"], 3)
    return root, {name: decode(ids, skip_special_tokens=True) for name, ids in expected.items()}


@pytest.fixture(scope="module")
def server(tiny_llama, start_server, adapters):
    root, _ = adapters
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CORE_ALLOW_RUNTIME_LORA_UPDATING", "1")
        proc = start_server(
            tiny_llama,
            "--device", "auto", "--dtype", "float32", "--served-model-name", MODEL, "--drain-timeout", "0",
            "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
            "--lora-modules", f"sql={root / 'sql'}", json.dumps({"name": "sql2", "path": str(root / "sql")}),
        )  # fmt: skip
    yield proc
    proc.stop()


def complete(http, model):
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    return http.post("/v1/completions", json=body)


def text(response):
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_adapters_listed_with_parent(http, adapters):
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    assert set(cards) == {MODEL, "sql", "sql2"}
    assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == str(adapters[0] / "sql")


def test_model_field_selects_the_adapter(http, adapters):
    expected = adapters[1]
    assert text(complete(http, "sql")) == text(complete(http, "sql2")) == expected["sql"]
    assert text(complete(http, MODEL)) == expected["base"] != expected["sql"]
    missing = complete(http, "nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_runtime_load_and_unload(http, adapters):
    root, expected = adapters
    assert (
        http.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(root / "chat")}).status_code
        == 200
    )
    assert text(complete(http, "chat")) == expected["chat"]
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.0}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    wide = http.post("/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": str(root / "wide")})
    assert wide.status_code == 400 and "rank 16 is above the maximum LoRA rank 8" in wide.json()["error"]["message"]
    bad = http.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(root / "nowhere")})
    assert bad.status_code == 400 and "nowhere" in bad.json()["error"]["message"]
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "chat"}).status_code == 200
    assert complete(http, "chat").status_code == 404
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "chat"}).status_code == 404
    assert "chat" not in {c["id"] for c in http.get("/v1/models").json()["data"]}
