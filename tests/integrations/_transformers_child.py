"""One small real ``transformers`` Trainer run for the callback's resume tests: a tiny GPT-2 or
BERT built from a config (random weights, a 64-token vocabulary, token ids drawn locally; no hub
access), ``gradient_accumulation_steps=4``, dropout, AdamW with a linear warm-up schedule,
appending one JSON line per micro-batch (global step, micro-batch, loss) to TRACE and printing
``final-weights-sha256: ...`` at the end.

argv: RUN_DIR TRACE MODE MODEL PRECISION WORKERS
  MODE       spotwise: SpotwiseCallback(RUN_DIR, every=2); trainer.train()
             plain: the Trainer's own checkpoints every 2 steps in RUN_DIR and
             train(resume_from_checkpoint=True) once one exists (what its docs say to do)
  MODEL      gpt2 (causal LM), bert (masked LM, masks drawn in the dataset, so in workers) or
             gpt2-sft (the GPT-2 trained by TRL's SFTTrainer)
  PRECISION  fp32 or bf16
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

VOCAB, LENGTH, SIZE = 64, 12, 36  # 18 micro-batches of 2 an epoch: 5 steps, the last of 2
STEPS = 12
SLEEP_S = 0.01  # per micro-batch, so that a kill can land anywhere


class Tokens(Dataset):
    """Token ids made here; BERT's masks are drawn from the global torch RNG at load time."""

    def __init__(self, model: str) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(4, VOCAB, (SIZE, LENGTH), generator=g)
        self.model = model

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i].clone()
        if self.model == "gpt2":
            return {"input_ids": ids, "labels": ids.clone()}
        masked = torch.rand(LENGTH) < 0.3
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        return {"input_ids": torch.where(masked, torch.full_like(ids, 3), ids), "labels": labels}


def sft_trainer(model: torch.nn.Module, args: TrainingArguments, callbacks: list[Any]) -> Trainer:
    """TRL's SFTTrainer on the same token ids, pre-tokenized, with a word-level tokenizer made
    here (its collator pads and makes the labels)."""
    import datasets
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
        pad_token="t0",
        eos_token="t2",
        unk_token="t3",
    )
    config = SFTConfig(**{**args.to_dict(), "max_length": LENGTH, "dataset_num_proc": None})
    rows = {"input_ids": Tokens("gpt2").ids.tolist()}
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_dict(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def build(model: str) -> torch.nn.Module:
    if model.startswith("gpt2"):
        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=LENGTH,
            n_embd=32,
            n_layer=2,
            n_head=2,
            bos_token_id=1,
            eos_token_id=2,
        )
        return GPT2LMHeadModel(config)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        pad_token_id=0,
    )
    return BertForMaskedLM(config)


def trace_losses(model: torch.nn.Module, trainer: Trainer, trace: str) -> None:
    """One line per micro-batch, from the model's own forward (the Trainer does not log
    micro-batches)."""
    seen = {"step": -1, "micro": 0}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        if not module.training:
            return
        step = trainer.state.global_step
        seen["micro"] = seen["micro"] + 1 if step == seen["step"] else 0
        seen["step"] = step
        line = {"step": step, "micro": seen["micro"], "loss": output.loss.float().item()}
        with open(trace, "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(SLEEP_S)

    model.register_forward_hook(hook)


def main() -> None:
    run_dir, trace, mode, model_name, precision, workers = sys.argv[1:7]
    torch.set_num_threads(1)  # the test machine's cores are shared
    torch.manual_seed(1)
    model = build(model_name)
    args = TrainingArguments(
        output_dir=run_dir if mode == "plain" else run_dir + "-out",
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        dataloader_num_workers=int(workers),
        learning_rate=5e-3,
        warmup_steps=3,
        bf16=precision == "bf16",
        use_cpu=True,
        seed=3,
        report_to=[],
        logging_steps=1,
        disable_tqdm=True,
        save_strategy="steps" if mode == "plain" else "no",
        save_steps=2,
    )
    callbacks: list[Any] = []
    if mode == "spotwise":
        from spotwise.integrations.transformers import SpotwiseCallback

        callbacks.append(SpotwiseCallback(run_dir, every=2))
    if model_name == "gpt2-sft":  # TRL's SFTTrainer, a Trainer subclass with the same loop
        trainer = sft_trainer(model, args, callbacks)
    else:
        trainer = Trainer(
            model=model, args=args, train_dataset=Tokens(model_name), callbacks=callbacks
        )
    trace_losses(model, trainer, trace)
    resume = mode == "plain" and any(Path(run_dir).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    resumed = callbacks[0].run.resumed_from if callbacks else resume or None
    if resumed is not None:
        print(f"resumed-from: {getattr(resumed, 'step', resumed)}", flush=True)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
