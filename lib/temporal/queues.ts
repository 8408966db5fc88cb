/** The task queues of a run's worker pools, from `temporal.task_queue` (the prefix). */
export const taskQueues = (prefix: string) => ({ cpu: `${prefix}.cpu`, trainer: `${prefix}.trainer` });
