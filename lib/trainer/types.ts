/** What the trainer runtime reports per step and in total (activities pass these on as they are). */

/** Where a train step's time went (seconds). */
export interface TrainSeconds {
  load: number;
  replay: number;
  train: number;
  save: number;
}

/**
 * The engine's metrics of a step (native `StepMetrics`) that code here reads. The engine reports
 * more (entropy, mismatch_kl, masked_*, ...: native/src/loss.cc), all recorded as they are.
 */
export interface EngineMetrics {
  loss: number;
  /** trainer.kl_penalty: mean k3 KL to the reference policy (0 when off). */
  kl_divergence: number;
  grad_norm: number;
  tokens: number;
  loss_tokens: number;
  tokens_per_s: number;
  /** MoE models only: router load-balancing loss, and tokens per expert (max, mean) over the sparse layers. */
  router_aux_loss?: number;
  expert_load_max?: number;
  expert_load_mean?: number;
}

/**
 * Trainer metrics of one step, as prime-rl logs them: every metric the engine computed, by its
 * name (a new one there is recorded as it is), and what the runtime adds.
 */
export interface TrainMetrics extends EngineMetrics {
  /** The KL penalty's beta this step used (0 when off). */
  kl_beta: number;
  lr: number;
  seconds: TrainSeconds;
  /** weight_broadcast nccl: the servers the new version reached by broadcast, and those it missed (they read its folder). */
  weight_broadcast_servers?: number;
  weight_broadcast_missed?: number;
}

/** Cumulative trainer counters: equal between an interrupted and an uninterrupted run. */
export interface TrainProgress {
  steps: number;
  samples: number;
  tokens: number;
}
