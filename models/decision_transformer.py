"""Decision Transformer (Chen et al. 2021) as the Primal-Attention RL code builds it
(PrimalAttention_RL, after thuml/Flowformer Flowformer_RL and kzl/decision-transformer:
decision_transformer.py, trajectory_gpt2.py).

Tokens (R_t, s_t, a_t) per timestep, each a linear embedding plus a learned timestep embedding
(no position embeddings: the GPT-2 stack's wpe is removed), LayerNorm, embedding dropout, a
GPT-2 stack (pre-LayerNorm blocks, ReLU MLP 4 d wide, residual and attention dropout, final
LayerNorm) run causally over the 3K tokens; the action a_t is predicted from the token of s_t
through Linear + tanh.

Initialisation, as the authors' code does it (the only one: the D4RL configs have no other).
trajectory_gpt2.py's ``GPT2Model.__init__`` builds every block -- the Primal block's
``Primal_attention`` (and Flowformer_RL's ``Flowformer_attention``) included -- before its
``init_weights()``, so GPT2PreTrainedModel._init_weights reaches all of them: N(0, 0.02) Linear /
Conv1D weights, zero biases, LayerNorm ones / zeros (``gpt2_init_`` on ``decoder``). Parameters that
are no module's weight keep their own init (Primal's W_e, W_r orthogonal, Lambda uniform(0, 1)).
decision_transformer.py builds embed_timestep, embed_return/state/action, embed_ln and
predict_action after the GPT2Model, so they keep PyTorch's defaults (Embedding N(0, 1), Linear
uniform(+-1/sqrt(fan_in)) weights and biases). Unlike the ViT backbone, this one ignores an
attention's ``block_init`` (Primal init=code): the CV code's Primal block missed timm's init, the RL
one did not. tests/test_d4rl.py checks every parameter against a transcription of these rules.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnbench.models.causal import CausalDecoder, build_causal_decoder


def gpt2_init_(module: nn.Module, std: float = 0.02) -> None:
    """GPT2PreTrainedModel._init_weights on every Linear / Embedding / LayerNorm of ``module``."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class DecisionTransformer(nn.Module):
    def __init__(self, state_dim: int, act_dim: int, decoder: CausalDecoder, d_model: int, max_ep_len: int = 1000,
                 dropout: float = 0.1, action_tanh: bool = True):
        super().__init__()
        self.state_dim, self.act_dim, self.d_model = state_dim, act_dim, d_model
        self.embed_timestep = nn.Embedding(max_ep_len, d_model)
        self.embed_return = nn.Linear(1, d_model)
        self.embed_state = nn.Linear(state_dim, d_model)
        self.embed_action = nn.Linear(act_dim, d_model)
        self.embed_ln = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)  # GPT-2's embd_pdrop on the input embeddings
        self.decoder = decoder
        gpt2_init_(self.decoder)
        self.predict_action = nn.Sequential(nn.Linear(d_model, act_dim), *([nn.Tanh()] if action_tanh else []))

    def forward(self, states: torch.Tensor, actions: torch.Tensor, returns_to_go: torch.Tensor,
                timesteps: torch.Tensor) -> torch.Tensor:
        """(B, K, state_dim), (B, K, act_dim), (B, K, 1), (B, K) -> predicted actions (B, K, act_dim)."""
        b, k = states.shape[:2]
        time = self.embed_timestep(timesteps.long())
        tokens = torch.stack((self.embed_return(returns_to_go) + time, self.embed_state(states) + time,
                              self.embed_action(actions) + time), dim=2)  # (B, K, 3, d): R_1, s_1, a_1, R_2, ...
        h = self.decoder(self.dropout(self.embed_ln(tokens.reshape(b, 3 * k, self.d_model))))
        return self.predict_action(h.reshape(b, k, 3, self.d_model)[:, :, 1])  # from the state tokens


def build_decision_transformer(model_cfg, backbone, state_dim: int, act_dim: int, context_len: int,
                               max_ep_len: int) -> DecisionTransformer:
    from omegaconf import OmegaConf

    b = OmegaConf.to_container(backbone, resolve=True) if not isinstance(backbone, dict) else dict(backbone)
    known = {"n_layers", "d_model", "n_heads", "d_ff", "dropout", "attention_dropout", "activation",
             "activation_dropout", "action_tanh"}
    if set(b) - known:
        raise TypeError(f"unknown d4rl backbone options: {', '.join(sorted(set(b) - known))}")
    decoder = build_causal_decoder(model_cfg, b, 3 * context_len)
    return DecisionTransformer(state_dim, act_dim, decoder, int(b["d_model"]), max_ep_len, float(b.get("dropout", 0.1)),
                               bool(b.get("action_tanh", True)))
