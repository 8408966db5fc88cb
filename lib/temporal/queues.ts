/**
 * The task queues of a run, from its `temporal.task_queue` prefix: `<prefix>.cpu` (the workflows
 * and the orchestrator activities) and `<prefix>.trainer` (one activity at a time). The one place
 * these names are made: workflows, workers, the launcher and tests all use it. Sandbox-safe (no
 * Node imports): workflow code imports it.
 */
export interface TaskQueues {
  cpu: string;
  trainer: string;
}

export const taskQueues = (prefix: string): TaskQueues => ({ cpu: `${prefix}.cpu`, trainer: `${prefix}.trainer` });
