"""Norms for the CPU proxy that keep for backward what the fused GPU kernels keep.

With the local layer spec megatron-core builds `torch.nn.RMSNorm` / `torch.nn.LayerNorm`. On a bf16 input
torch's composite RMSNorm upcasts to fp32 and saves the fp32 input, the fp32 normalised output and the
fp32 inverse RMS: 8 B per element plus 4 B per token, where TransformerEngine's and Apex's fused norms
(what a GPU run uses) save the bf16 input and the fp32 statistics: 2 B per element plus 4 (RMSNorm) or 8
(LayerNorm) B per token. These modules compute the same function in fp32 and save only the input and the
statistics, so the proxy's saved activations follow the GPU kernels' memory behaviour. Parameters are the
same (`weight`, and `bias` for LayerNorm), so parameter counts and checkpoints are unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ProxyRMSNorm", "ProxyLayerNorm"]


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_weight = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
        gw = g * weight.float()
        grad_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return ((xf - mean) * rstd * weight.float() + bias.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, weight, mean, rstd = ctx.saved_tensors
        xhat = (x.float() - mean) * rstd
        g = grad.float()
        flat = x.shape[-1]
        grad_weight = (g * xhat).reshape(-1, flat).sum(0)
        grad_bias = g.reshape(-1, flat).sum(0)
        gw = g * weight.float()
        grad_x = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None


class ProxyRMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


class ProxyLayerNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LayerNormFn.apply(x, self.weight, self.bias, self.eps)
