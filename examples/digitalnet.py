"""DigitalNet, as partrain's built-in `digitalnet` model (docs/architecture.md), in Python.

Four conv3x3 units (no bias when followed by BatchNorm) of widths c, 2c, 4c, 8c, each
followed by BatchNorm and ReLU, max-pooling after the first three and a global average
pool after the last, then one linear layer. The attribute names are those of partrain's
built-in model (conv1, bn1, ..., fc), so the state dicts of the two share their keys.
"""

import torch
from torch import nn


class DigitalNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 100, width: int = 64,
                 batch_norm: bool = True):
        super().__init__()
        c = width
        widths = [in_channels, c, 2 * c, 4 * c, 8 * c]
        for i in range(1, 5):
            conv = nn.Conv2d(widths[i - 1], widths[i], 3, padding=1, bias=not batch_norm)
            setattr(self, f"conv{i}", conv)
            setattr(self, f"bn{i}", nn.BatchNorm2d(widths[i]) if batch_norm else nn.Identity())
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        x = self.pool(torch.relu(self.bn3(self.conv3(x))))
        x = torch.relu(self.bn4(self.conv4(x)))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)
