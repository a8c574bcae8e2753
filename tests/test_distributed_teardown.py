"""Lightning's teardown copies the model and optimizer states to host memory; the lab frees them first.

Real Lightning on a CPU: the copy itself costs nothing here (the tensors are on the CPU already), so the test
looks at what the strategy's teardown is handed. The cost it avoids was measured on an H100 (one-gpu, 7B:
70 s and 52 GiB of host memory after the loop; lab_helpers/training/distributed/teardown.py).
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lab_helpers.training.distributed.teardown import FreeTrainingStateAtEnd


class TinyModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 64), batch_size=4)


class WatchedStrategy(SingleDeviceStrategy):
    """Lightning's single-device strategy, noting what its teardown would move to host memory."""

    seen: dict[str, int] = {}

    def teardown(self) -> None:
        states = [s for opt in self.optimizers for s in opt.state.values()]
        WatchedStrategy.seen = {
            "optimizer_state_tensors": sum(isinstance(v, torch.Tensor) for s in states for v in s.values()),
            "parameter_elements": sum(p.numel() for p in self.lightning_module.parameters()),
        }
        super().teardown()


def _fit(callbacks: list[L.Callback]) -> dict[str, int]:
    trainer = L.Trainer(
        accelerator="cpu", strategy=WatchedStrategy(device=torch.device("cpu")), max_steps=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(TinyModule())
    return WatchedStrategy.seen


def test_teardown_is_handed_no_model_and_no_optimizer_state():
    assert _fit([]) == {"optimizer_state_tensors": 6, "parameter_elements": 64 * 64 + 64}  # what Lightning copies
    assert _fit([FreeTrainingStateAtEnd()]) == {"optimizer_state_tensors": 0, "parameter_elements": 0}
