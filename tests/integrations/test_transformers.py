"""The Hugging Face ``Trainer.train`` recorded through ``HookdbgCallback``: a tiny BERT
built from a config, on CPU, read back with hookdbg's reader."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import Trainer

from hookdbg.integrations.transformers import HookdbgCallback
from hookdbg.read import RankSet, open_recording, open_run
from tests.helpers import ROOT, torchrun
from tests.integrations.hf_model import Embedded, Tokens, arguments, tiny_bert


@pytest.mark.parametrize("accum", [1, 2])
def test_train_steps_are_the_global_steps_and_evaluations_eval_batches(tmp_path, accum):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), quiet=True)
    args = arguments(str(tmp_path / "out"), accum, eval_strategy="steps", eval_steps=2)
    model = tiny_bert()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(32),
        eval_dataset=Tokens(8),
        callbacks=[callback],
    )
    trainer.train()
    assert trainer.state.global_step == 4 and callback.recorder is None
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"complete"
        # evaluation at steps 2 and 4, two batches each
        assert (len(rec.steps), len(rec.evals)) == (trainer.state.global_step, 4)
        assert len(rec.alerts) == 0  # padded attention masks are no alert
        names = {m.name for m in rec.modules}
        assert "model.bert.encoder.layer.0.attention.self.query" in names


@pytest.mark.parametrize(
    ("accum", "global_step", "recorded"),
    [
        (1, 3, 3),  # NaN in the third batch (step 2): it finishes, the trainer stops
        (2, 1, 2),  # NaN in step 1's first micro-batch: stopped before its optimizer step
    ],
)
def test_nan_stops_the_trainer(tmp_path, capfd, accum, global_step, recorded):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), on_nan="stop")
    args = arguments(str(tmp_path / "out"), accum, max_steps=6)
    model = tiny_bert()
    trainer = Trainer(
        model=model, args=args, train_dataset=Embedded(nan_from=8), callbacks=[callback]
    )
    trainer.train()
    assert trainer.state.global_step == global_step
    err = capfd.readouterr().err
    assert f"stopping the trainer at global step {global_step}" in err
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"stopped"
        assert f"the trainer stopped at global step {global_step}".encode() in rec.end["message"]
        # a step the stop cut short (its forward and backward ran) is in the recording
        assert len(rec.steps) == recorded
        assert len(rec.alerts) == 1 and rec.alerts["step"][0] == 8 // (4 * accum)
        assert rec.modules[int(rec.alerts["module"][0])].name.startswith("model.bert.")


def test_an_exception_is_closed_by_the_next_train_or_close(tmp_path):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), quiet=True)
    model = tiny_bert()
    trainer = Trainer(
        model=model,
        args=arguments(str(tmp_path / "out")),
        train_dataset=Embedded(fail_at=9),
        callbacks=[callback],
    )
    with pytest.raises(RuntimeError, match="the data loader broke"):
        trainer.train()
    assert callback.recorder is not None  # the Trainer called no callback
    trainer.train_dataset = Embedded()
    trainer.train()  # closes the first recording, records into run.2.h5
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"exception"
        assert b"without its end-of-training hook" in rec.end["message"]
    with open_recording(tmp_path / "run.2.h5") as rec:
        assert rec.end["status"] == b"complete" and len(rec.steps) == 4
    trainer.train_dataset = Embedded(fail_at=2)
    with pytest.raises(RuntimeError, match="the data loader broke"):
        trainer.train()
    callback.close(message="RuntimeError: the data loader broke")
    with open_recording(tmp_path / "run.3.h5") as rec:
        assert rec.end["status"] == b"exception"
        assert rec.end["message"] == b"RuntimeError: the data loader broke"


CRASH = """
from transformers import Trainer
from hookdbg.integrations.transformers import HookdbgCallback
from tests.integrations.hf_model import Embedded, arguments, tiny_bert

model = tiny_bert()
trainer = Trainer(model=model, args=arguments("out"), train_dataset=Embedded(fail_at=9),
                  callbacks=[HookdbgCallback("run.h5", quiet=True)])
trainer.train()
"""


def test_a_crash_is_closed_at_exit_with_its_exception(tmp_path):
    (tmp_path / "crash.py").write_text(textwrap.dedent(CRASH))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "crash.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and "RuntimeError: the data loader broke" in done.stderr
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"exception"
        assert rec.end["message"] == b"RuntimeError: the data loader broke"


TORCHRUN = """
from transformers import Trainer
from hookdbg.integrations.transformers import HookdbgCallback
from tests.integrations.hf_model import Embedded, arguments, tiny_bert

model = tiny_bert()
trainer = Trainer(model=model, args=arguments("out", max_steps=6),
                  train_dataset=Embedded(nan_from=16),
                  callbacks=[HookdbgCallback("run.h5", on_nan="stop")])
trainer.train()
print("rank", trainer.args.process_index, "global_step", trainer.state.global_step)
"""


def test_torchrun_writes_one_file_per_rank(tmp_path):
    (tmp_path / "hf.py").write_text(textwrap.dedent(TORCHRUN))
    done = torchrun("hf.py", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    # each rank reads its own share: item 16 comes in the third step on both
    assert "rank 0 global_step 3" in done.stdout and "rank 1 global_step 3" in done.stdout
    with open_run(tmp_path / "run.h5") as run:
        assert isinstance(run, RankSet) and run.ranks == [0, 1]
        for rank, rec in run.recordings.items():
            assert (rec.info.rank, rec.info.world_size) == (rank, 2)
            assert rec.end["status"] == b"stopped" and len(rec.steps) == 3
            names = {m.name for m in rec.modules}
            assert "model.bert.embeddings.LayerNorm" in names
            assert not any(n.startswith(("model_wrapped", "module")) for n in names)


def test_wav2vec2_built_while_recording_is_named_and_counted_as_trained(tmp_path):
    """wav2vec2's positional convolution is weight-normed: Hugging Face's weight
    initialisation reads it with no module call around, which is no eval batch, and
    the model keeps the script's name for it."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    import hookdbg

    config = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        vocab_size=8,
        mask_time_prob=0.0,
    )
    torch.manual_seed(0)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model = Wav2Vec2ForCTC(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(2, 1000), labels=torch.randint(1, 8, (2, 5))).loss.backward()
            opt.step()
    with open_recording(tmp_path / "run.h5") as rec:
        assert (len(rec.steps), len(rec.evals)) == (2, 0)
        models = [m for m in rec.modules if m.is_model_part]
        assert {m.name.split(".")[0] for m in models} == {"model"}
        conv = rec.modules.resolve("model.wav2vec2.encoder.pos_conv_embed.conv")
        weight = rec.modules.resolve(f"{conv.name}.parametrizations.weight")
        calls = rec.calls()
        forward = calls[calls["phase"] == 0]
        module_of = dict(zip(forward["call"].tolist(), forward["module"].tolist(), strict=True))
        inside = forward[forward["module"] == weight.id]  # read inside the convolution
        assert [module_of[parent] for parent in inside["parent"].tolist()] == [conv.id] * 2
