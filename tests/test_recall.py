"""Associative recall: the data generator, the CLI's input checks, and that training reduces the loss."""

import json

import pytest
import torch
import torch.nn.functional as F

from orchid_hf.recall import (
    RecallConfig,
    RecallModel,
    check_answers,
    generate_batch,
    results_table,
    rotary_tables,
    rotate,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.mark.parametrize("vocab_size,seq_len", [(20, 128), (30, 128), (40, 64), (4, 5), (20, 33)])
def test_every_answer_is_the_query_keys_value(vocab_size, seq_len):
    inputs, targets = generate_batch(500, vocab_size, seq_len, torch.Generator().manual_seed(1))
    assert inputs.shape == (500, seq_len) and targets.shape == (500,)
    assert check_answers(inputs, targets, vocab_size)


def test_keys_and_values_come_from_disjoint_halves():
    vocab_size, half = 20, 10
    inputs, targets = generate_batch(300, vocab_size, 128, torch.Generator().manual_seed(2))
    body = inputs[:, 1:-1]  # seq_len 128: one start token, 63 pairs, the query
    assert (inputs[:, 0] == vocab_size).all()
    assert (body[:, 0::2] < half).all() and (body[:, 1::2] >= half).all() and (body[:, 1::2] < vocab_size).all()
    assert (inputs[:, -1] < half).all() and (targets >= half).all() and (targets < vocab_size).all()
    # Each sequence has its own dictionary: the same key maps to different values across sequences.
    first_key_values = {(row[1], row[2]) for row in inputs[:, :3].tolist()}
    assert len({v for k, v in first_key_values if k == inputs[0, 1].item()}) > 1


def test_a_wrong_answer_is_detected():
    inputs, targets = generate_batch(8, 20, 32, torch.Generator().manual_seed(3))
    wrong = targets.clone()
    wrong[0] = 10 + (wrong[0] - 10 + 1) % 10
    assert not check_answers(inputs, wrong, 20)


def test_bad_sizes_name_the_field():
    with pytest.raises(ValueError, match="seq_len=4 .* 1 key-value pair"):
        generate_batch(2, 20, 4)
    with pytest.raises(ValueError, match="vocab_size .* got 3"):
        generate_batch(2, 3, 32)
    with pytest.raises(ValueError, match="vocab_size .* got 21"):
        RecallConfig(vocab_size=21).validate()
    with pytest.raises(ValueError, match="model must be one of"):
        RecallConfig(model="mamba").validate()
    with pytest.raises(ValueError, match="d_model=60 must be divisible by 2 \\* n_heads=16"):
        RecallConfig(model="transformer", d_model=60, n_heads=8).validate()
    with pytest.raises(ValueError, match="transformer_positions must be one of"):
        RecallConfig(model="transformer", transformer_positions="alibi").validate()


def test_rotary_attention_scores_depend_only_on_the_offset():
    # RoPE's defining property: <R_i q, R_j k> depends on i - j only, so shifting both positions keeps the score.
    cos, sin = rotary_tables(32, 8, dtype=torch.float64)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def score(i, j):
        return (rotate(q, cos[i], sin[i]) * rotate(k, cos[j], sin[j])).sum()

    torch.testing.assert_close(score(3, 7), score(20, 24), atol=1e-12, rtol=0)
    assert not torch.isclose(score(3, 7), score(3, 8))


@pytest.mark.parametrize(
    "model,positions", [("orchid", "rope"), ("static", "rope"), ("transformer", "rope"), ("transformer", "learned")]
)
def test_a_few_steps_reduce_the_loss(model, positions):
    torch.manual_seed(0)
    config = RecallConfig(
        model=model, vocab_size=8, seq_len=16, d_model=16, mlp_ratio=2, transformer_positions=positions
    )
    net = RecallModel(config)
    inputs, targets = generate_batch(32, 8, 16, torch.Generator().manual_seed(4))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    first = F.cross_entropy(net(inputs), targets).item()
    for _ in range(20):
        loss = F.cross_entropy(net(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.8 * first


def test_training_loop_logs_a_curve_and_the_table_reads_it(tmp_path):
    config = RecallConfig(vocab_size=8, seq_len=16, d_model=16, steps=4, batch_size=8, warmup_steps=2,
                          eval_every=2, eval_size=20)
    result = train(config, log_path=tmp_path / "run.log", progress=False)
    assert [p["step"] for p in result["curve"]] == [2, 4]
    assert len((tmp_path / "run.log").read_text().splitlines()) == 2
    (tmp_path / "run.json").write_text(json.dumps(result))
    table = results_table([tmp_path / "run.json"])
    assert "| orchid / dct / abs / spatial+spectral / h0 dct(h0), Listing 1 | 8 | 16 | 4 |" in table
