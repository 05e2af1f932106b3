"""LSTM / GRU over the window; the last hidden state feeds a small head."""

import torch
from torch import nn


class RecurrentRegressor(nn.Module):
    def __init__(self, n_features: int, cell: str = "lstm", hidden_size: int = 64,
                 num_layers: int = 2, dropout: float = 0.1):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(n_features, hidden_size, num_layers=num_layers, batch_first=True,
                       dropout=dropout if num_layers > 1 else 0.0)
        self.head = nn.Sequential(
            nn.LayerNorm(hidden_size), nn.Dropout(dropout), nn.Linear(hidden_size, hidden_size),
            nn.ReLU(), nn.Linear(hidden_size, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(x)
        return self.head(output[:, -1]).squeeze(-1)
