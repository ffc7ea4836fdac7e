"""The pretraining recipe in-process: document boundaries (segment masks, the EOS target), the
token-sum loss under gradient accumulation, the decay mask, WSD and the warm-up, GQA and QK-norm."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import config
from trainer.data import pipeline as data
from trainer.loop import unpack
from trainer.model import sizes
from trainer.model import transformer as model
from trainer.model.mesh import BATCH_AXES, batch_sharding, logical_rules, make_mesh
from trainer.step import abstract_state, from_plain, init_state, make_train_step, optimizer, schedule

EOS = 7
DOCS = ["data.eos_id=7", "model.document_attention=true"]


def _batch(cfg: config.Config, gb: int = 16) -> np.ndarray:
    """The synthetic global batch of step 0 with EOS tokens at uneven places: some rows have
    several documents, some none, so the micro-batches count different numbers of targets."""
    tokens = (
        next(
            iter(
                data.make_dataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, data.Layout(gb, 1), 0, 1)
            )
        )["tokens"]
        .reshape(gb, -1)
        .copy()
    )
    tokens[tokens == EOS] = EOS + 1
    rng = np.random.default_rng(0)
    for row in range(gb):
        for _ in range(row % 5):  # 0-4 boundaries per row, more in the later rows
            tokens[row, rng.integers(1, tokens.shape[1] - 1)] = EOS
    return tokens


def _train(cfg: config.Config, tokens: np.ndarray, accum: int, steps: int = 2) -> tuple[dict, list]:
    mesh = make_mesh(cfg.moe.num_experts)
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        state = init_state(cfg, mesh, abstract)
        step = make_train_step(cfg, graphdef, mesh, abstract)
        stop = jax.device_put(np.zeros(8, np.int32), NamedSharding(mesh, P(BATCH_AXES)))
        batch = jax.device_put(tokens.reshape(accum, tokens.shape[0] // accum, -1), batch_sharding(mesh))
        for _ in range(steps):
            state, metrics = step(state, batch, stop)
        return unpack(jax.device_get(metrics)), jax.device_get(jax.tree.leaves(state))


@pytest.mark.parametrize(
    "layout", [[], ["model.attention_block=8", "model.loss_chunk=8"]], ids=["whole", "blocked+chunked"]
)
def test_document_masks_accumulation_1_vs_4_is_the_one_batch_step(cpu8: list, layout: list[str]) -> None:
    sets = [
        *DOCS,
        *layout,
        "model.dense_layers=1",
        "optim.warmup_nonzero_start=true",
        "model.logit_z_loss=1e-3",
    ]
    cfg = config.resolve("tiny", sets, {})
    tokens = _batch(cfg, 32)  # 4 micro-batches of one sequence per device
    inputs = tokens[:, :-1]
    per_micro = [(inputs[i * 8 : (i + 1) * 8] != EOS).sum() for i in range(4)]
    assert len(set(per_micro)) > 1  # unequal masks: a mean of micro-batch means would differ
    (m1, p1), (m4, p4) = _train(cfg, tokens, 1), _train(cfg, tokens, 4)
    for key in ("loss", "total_loss", "lb_loss", "z_loss", "logit_z_loss", "grad_norm"):
        assert abs(m1[key] - m4[key]) < 1e-5, (key, m1[key], m4[key])
    assert max(float(np.abs(a - b).max()) for a, b in zip(p1, p4, strict=True)) < 1e-5
    assert m1["logit_z_loss"] > 0 and m1["lr"] > 0


def _model(cfg: config.Config) -> tuple[nnx.Module, object]:
    mesh = make_mesh(cfg.moe.num_experts)
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        state = init_state(cfg, mesh, abstract)
        m, _ = nnx.merge(graphdef, from_plain(abstract, state))
    return m, mesh


@pytest.mark.parametrize("block", [0, 8], ids=["whole", "blocked"])
def test_a_token_after_an_eos_never_attends_to_the_previous_document(cpu8: list, block: int) -> None:
    """Perturb every token of the first document: the logits of the second do not move with
    document attention, and do without it (so this test can fail)."""
    moved = {}
    for documents in (True, False):
        sets = ["data.eos_id=7", f"model.document_attention={documents}", f"model.attention_block={block}",
                "model.dense_layers=1", "model.qk_norm=true", "model.kv_heads=2"]  # fmt: skip
        cfg = config.resolve("tiny", sets, {})
        m, mesh = _model(cfg)
        tokens = _batch(cfg)[:8, :-1].copy()
        tokens[tokens == EOS] = EOS + 1
        tokens[:, 11] = EOS  # document 1: positions 0-11 (the EOS ends it), document 2: 12-31
        other = tokens.copy()
        first = (other[:, :11] + 3) % cfg.model.vocab_size
        other[:, :11] = np.where(first == EOS, EOS + 1, first)  # no new boundary inside it
        with jax.set_mesh(mesh):
            a, _ = m(jax.device_put(tokens, batch_sharding(mesh)))
            b, _ = m(jax.device_put(other, batch_sharding(mesh)))
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a[:, :11] - b[:, :11]).max() > 1e-3  # the first document's own logits move
        moved[documents] = float(np.abs(a[:, 12:] - b[:, 12:]).max())
    assert moved[True] == 0.0, moved
    assert moved[False] > 1e-3, moved


def test_the_target_after_an_eos_carries_no_loss(cpu8: list) -> None:
    cfg = config.resolve("tiny", [*DOCS, "model.loss_chunk=8"], {})
    m, mesh = _model(cfg)
    tokens = _batch(cfg)[:8]
    inputs, targets = tokens[:, :-1], tokens[:, 1:].copy()
    after_eos = inputs == EOS
    assert after_eos.sum() > 0
    changed = targets.copy()
    changed[after_eos] = (changed[after_eos] + 1) % cfg.model.vocab_size
    with jax.set_mesh(mesh):
        put = lambda x: jax.device_put(x, batch_sharding(mesh))  # noqa: E731
        ce, aux = m.loss(put(inputs), put(targets))
        ce2, aux2 = m.loss(put(inputs), put(changed))
    assert float(aux["loss_sum"]) == float(aux2["loss_sum"]) and float(ce) == float(ce2)
    assert int(aux["loss_tokens"]) == int((~after_eos).sum())
    assert abs(float(ce) - float(aux["loss_sum"]) / float(aux["loss_tokens"])) < 1e-6
    # Without data.eos_id the same change is trained on: the comparison can fail.
    m_plain, mesh = _model(config.resolve("tiny", ["model.loss_chunk=8"], {}))
    with jax.set_mesh(mesh):
        put = lambda x: jax.device_put(x, batch_sharding(mesh))  # noqa: E731
        p1, _ = m_plain.loss(put(inputs), put(targets))
        p2, _ = m_plain.loss(put(inputs), put(changed))
    assert float(p1) != float(p2)


def _zero_gradient_update(cfg: config.Config) -> tuple[dict, dict]:
    """Parameters before and after one AdamW update with a zero gradient: only weight decay moves them."""
    mesh = make_mesh(cfg.moe.num_experts)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        m = model.Transformer(cfg, rngs=nnx.Rngs(0))
        params = nnx.state(m, nnx.Param)
        tx = optimizer(cfg)
        zeros = jax.tree.map(np.zeros_like, params)
        updates, _ = tx.update(zeros, tx.init(params), params)
        after = optax.apply_updates(params, updates)
    flat = lambda s: {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(s)}  # noqa: E731
    return flat(params), flat(after)


def test_no_norm_scale_and_no_embedding_is_decayed(cpu8: list) -> None:
    sets = ["model.dense_layers=1", "model.qk_norm=true", "optim.warmup_steps=0"]
    before, after = _zero_gradient_update(config.resolve("tiny", sets, {}))
    norms = [k for k in before if "norm" in k]
    # Scanned layers' norm scales are [layers, d] (what ndim >= 2 decayed), the final norm's [d].
    assert {before[k].ndim for k in norms} == {1, 2} and any("q_norm" in k for k in norms)
    for k in [*norms, "embed"]:
        assert np.array_equal(before[k], after[k]), k
    decayed = [k for k in before if k not in norms and k != "embed"]
    assert decayed and all(not np.array_equal(before[k], after[k]) for k in decayed)
    # The OLMo-core options put them back.
    sets += ["optim.decay_embeddings=true", "optim.decay_norm_and_bias=true"]
    before, after = _zero_gradient_update(config.resolve("tiny", sets, {}))
    assert all(not np.array_equal(before[k], after[k]) for k in [*norms, "embed"])


def test_schedules_wsd_and_the_first_warmup_step() -> None:
    cfg = config.resolve("tiny", ["optim.schedule=wsd", "optim.warmup_nonzero_start=true", "optim.warmup_steps=4",
                                  "train.steps=100", "optim.decay_fraction=0.2"], {})  # fmt: skip
    lr, o = schedule(cfg), cfg.optim
    assert config.wsd_decay_start(cfg) == 80
    assert float(lr(0)) == pytest.approx(o.lr / 4) and float(lr(3)) == pytest.approx(o.lr)
    assert all(float(lr(s)) == pytest.approx(o.lr) for s in (4, 50, 80))
    # The optimizer's step counter is unsigned: before the decay start, step - start must not wrap.
    assert float(lr(jnp.asarray(50, jnp.uint32))) == pytest.approx(o.lr)
    assert float(lr(90)) == pytest.approx(o.lr - (o.lr - o.lr * o.min_lr_ratio) * 0.5)
    assert float(lr(100)) == pytest.approx(o.lr * o.min_lr_ratio) == float(lr(500))
    # The default warm-up and cosine are optax's, as before these keys (bitwise).
    tiny = config.load("tiny")
    ref = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 10, 60, 3e-4)
    assert [float(schedule(tiny)(s)) for s in range(70)] == [float(ref(s)) for s in range(70)]
    cos = config.resolve("tiny", ["optim.warmup_nonzero_start=true"], {})
    assert float(schedule(cos)(0)) == pytest.approx(3e-4) and float(schedule(cos)(59)) > 3e-4


def test_a_wsd_run_may_move_its_decay_only_in_its_stable_phase() -> None:
    def point(steps: int) -> dict:
        return config.schedule_point(
            config.resolve("tiny", ["optim.schedule=wsd", f"train.steps={steps}"], {})
        )

    # identity: the same hash whatever train.steps, for WSD (cosine's decay steps are in it).
    wsd = [config.resolve("tiny", ["optim.schedule=wsd", f"train.steps={n}"], {}) for n in (100, 200)]
    assert config.config_hash(wsd[0]) == config.config_hash(wsd[1])
    assert config.config_hash(config.load("tiny")) != config.config_hash(
        config.resolve("tiny", ["train.steps=61"], {})
    )
    assert point(100) == {"decay_start": 90, "decay_end": 100}
    assert config.schedule_change(50, point(100), point(200)) is None  # stable: grow it
    assert config.schedule_change(90, point(100), point(200)) is None
    why = config.schedule_change(95, point(100), point(200))
    assert why is not None and "past the decay start 90" in why and "stable phase" in why
    assert config.schedule_change(150, point(200), point(100)) is not None  # shrinking past it
    assert config.schedule_change(150, point(200), point(200)) is None  # unchanged: a plain resume


def test_gqa_and_qk_norm_parameter_counts_and_olmo_7b() -> None:
    def count(cfg: config.Config) -> int:
        abstract = model.abstract_model(cfg)
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    cfg = config.resolve("tiny", ["model.kv_heads=2", "model.qk_norm=true", "model.dense_layers=1"], {})
    assert count(cfg) == sizes.param_counts(cfg)[0] < sizes.param_counts(config.load("tiny"))[0]
    # OLMo-core's olmo3_7B: embedding + 32 × (attention 4·4096² + QK-norms 2·4096 + norms 2·4096 +
    # SwiGLU 3·4096·11008) + LM head (4096 × 100352 and its norm).
    olmo = config.load("olmo-7b")
    expected = 2 * 100352 * 4096 + 4096 + 32 * (4 * 4096**2 + 4 * 4096 + 3 * 4096 * 11008)
    assert expected == 7_298_617_344 == sizes.param_counts(olmo)[0] == count(olmo)


def test_new_keys_are_refused_in_one_line_when_wrong() -> None:
    for bad, text in (
        ("model.kv_heads=3", "model.kv_heads must divide"),
        ("optim.schedule=linear", "optim.schedule must be"),
        ("data.eos_id=256", "data.eos_id must be -1"),
        ("optim.decay_fraction=0", "optim.decay_fraction"),
    ):
        with pytest.raises(config.ConfigError, match=text):
            config.resolve("tiny", [bad], {})


def test_the_compile_cache_key_covers_the_new_keys_but_not_a_stages_source() -> None:
    from trainer.state.compile_cache import program

    base = program(config.load("tiny"))
    for key in ("model.kv_heads=2", "model.qk_norm=true", "model.reordered_norm=true",
                "model.document_attention=true", "model.logit_z_loss=1e-5", "data.eos_id=3",
                "optim.schedule=wsd", "optim.decay_fraction=0.2", "optim.warmup_nonzero_start=true",
                "optim.decay_embeddings=true", "optim.decay_norm_and_bias=true"):  # fmt: skip
        assert program(config.resolve("tiny", [key], {})) != base, key
    for key in ("train.init_from=/elsewhere", "train.init_optimizer=false"):
        assert program(config.resolve("tiny", [key], {})) == base, key


def test_new_keys_at_their_defaults_leave_the_identity_as_it_was() -> None:
    """A checkpoint written before these keys existed resumes: their defaults are not in the hash."""
    ident = config.identity(config.load("tiny"))
    new = {"kv_heads", "qk_norm", "reordered_norm", "document_attention", "logit_z_loss", "schedule",
           "decay_fraction", "warmup_nonzero_start", "decay_embeddings", "decay_norm_and_bias", "eos_id"}  # fmt: skip
    assert not new & {k for section in ("model", "optim", "data") for k in ident[section]}
    assert "init" not in ident
    changed = config.identity(config.resolve("tiny", ["model.qk_norm=true", "data.eos_id=3"], {}))
    assert changed["model"]["qk_norm"] is True and changed["data"]["eos_id"] == 3
