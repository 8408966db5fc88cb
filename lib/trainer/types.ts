/** What the trainer runtime reports per step and in total (activities pass these on as they are). */

/** Trainer metrics of one step (loss, entropy, mismatch KL, masked fractions, ..., as prime-rl logs them). */
export interface TrainMetrics {
  loss: number;
  entropy: number;
  /** Mean rho - log rho - 1 (rho = exp(logp - mu)) over all, masked and unmasked loss tokens. */
  mismatch_kl: number;
  mismatch_kl_masked: number;
  mismatch_kl_unmasked: number;
  /** Fractions of loss tokens masked (policy term dropped): all, low side, high side. */
  masked_tokens: number;
  masked_low: number;
  masked_high: number;
  /** Of the masked tokens, the fractions with a positive / negative advantage. */
  masked_adv_positive: number;
  masked_adv_negative: number;
  masked_sequences: number;
  clipped: number;
  /** trainer.kl_penalty: mean k3 KL to the reference policy and the beta this step used (0 when off). */
  kl_divergence: number;
  kl_beta: number;
  grad_norm: number;
  lr: number;
  tokens: number;
  loss_tokens: number;
  tokens_per_s: number;
  /** MoE models only: router load-balancing loss, and tokens per expert (max, mean) over the sparse layers. */
  router_aux_loss?: number;
  expert_load_max?: number;
  expert_load_mean?: number;
  seconds: { load: number; replay: number; train: number; save: number };
}

/** Cumulative trainer counters: equal between an interrupted and an uninterrupted run. */
export interface TrainProgress {
  steps: number;
  samples: number;
  tokens: number;
}
