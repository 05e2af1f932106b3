"""Transformer encoder over the window (pre-norm, learned positions, mean pooling)."""

import torch
from torch import nn


class TransformerRegressor(nn.Module):
    def __init__(self, n_features: int, window: int, hidden_size: int = 64, num_heads: int = 4,
                 num_layers: int = 2, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Linear(n_features, hidden_size)
        self.position = nn.Parameter(torch.zeros(1, window, hidden_size))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(
            hidden_size, num_heads, dim_feedforward=2 * hidden_size, dropout=dropout,
            batch_first=True, norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.position[:, : x.shape[1]])
        return self.head(h.mean(dim=1)).squeeze(-1)
