// Generated from the native loss registry by `npm run gen:loss-kinds`: do not edit.
export const LOSS_KINDS = [
  {
    "name": "ce",
    "policy": false,
    "doc": "cross-entropy -logp (SFT)",
    "params": []
  },
  {
    "name": "cispo",
    "policy": true,
    "doc": "clipped IS-weight REINFORCE",
    "params": [
      {
        "name": "eps_high",
        "default": 0.28,
        "min": 0,
        "doc": "upper clip range of the importance ratio (DAPO clip-higher)"
      }
    ]
  },
  {
    "name": "dppo",
    "policy": true,
    "doc": "DPPO + KL (prime-rl's default): probability-difference trust region",
    "params": [
      {
        "name": "dppo_mask_low",
        "default": 0.2,
        "min": 0,
        "max": 1,
        "doc": "drop a token with advantage <= 0 whose probability fell by more than this"
      },
      {
        "name": "dppo_mask_high",
        "default": 0.2,
        "min": 0,
        "max": 1,
        "doc": "drop a token with advantage > 0 whose probability rose by more than this"
      },
      {
        "name": "adv_tau",
        "default": 1,
        "min": 0,
        "doc": "weight of the advantage term"
      },
      {
        "name": "kl_tau",
        "default": 0.001,
        "min": 0,
        "doc": "weight of the (log ratio)^2 term to the inference policy"
      }
    ]
  },
  {
    "name": "grpo",
    "policy": true,
    "doc": "PPO clip on the token ratio",
    "params": [
      {
        "name": "eps_low",
        "default": 0.2,
        "min": 0,
        "max": 1,
        "doc": "lower clip range of the importance ratio"
      },
      {
        "name": "eps_high",
        "default": 0.28,
        "min": 0,
        "doc": "upper clip range of the importance ratio (DAPO clip-higher)"
      }
    ]
  },
  {
    "name": "gspo",
    "policy": true,
    "doc": "PPO clip on the sequence ratio",
    "params": [
      {
        "name": "eps_low",
        "default": 0.2,
        "min": 0,
        "max": 1,
        "doc": "lower clip range of the importance ratio"
      },
      {
        "name": "eps_high",
        "default": 0.28,
        "min": 0,
        "doc": "upper clip range of the importance ratio (DAPO clip-higher)"
      }
    ]
  },
  {
    "name": "ipo",
    "policy": true,
    "doc": "dppo with a symmetric probability-difference trust region",
    "params": [
      {
        "name": "ipo_threshold",
        "default": 0.1,
        "min": 0,
        "max": 1,
        "doc": "drop a token whose probability moved by more than this either way"
      },
      {
        "name": "adv_tau",
        "default": 1,
        "min": 0,
        "doc": "weight of the advantage term"
      },
      {
        "name": "kl_tau",
        "default": 0.001,
        "min": 0,
        "doc": "weight of the (log ratio)^2 term to the inference policy"
      }
    ]
  }
] as const;
