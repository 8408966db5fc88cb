/**
 * Every activity's start and end in its worker's log at info level, with what a person watching a
 * cluster run asks first: which run (the workflow id is the run name; an eval child's is
 * `<run>-eval-<n>`), which step, which attempt (above 1: Temporal is retrying it), how long it took
 * and, when it failed, why. The lines go through the activity's context logger, so the SDK adds its
 * own fields (activity id, task queue, workflow type) after the message.
 */
import type { Context } from '@temporalio/activity';
import type { ActivityInboundCallsInterceptor, ActivityInterceptorsFactory } from '@temporalio/worker';

/** The step an activity's input names (`{runDir, step}` and its relatives), if any. */
function stepOf(args: readonly unknown[]): number | undefined {
  const first = args[0] as { step?: unknown } | undefined;
  return typeof first?.step === 'number' ? first.step : undefined;
}

/** `trainStep run my-run step 3 attempt 2`: the line's head. */
export function activityHead(ctx: Pick<Context, 'info'>, args: readonly unknown[]): string {
  const { activityType, attempt, workflowExecution } = ctx.info;
  const step = stepOf(args);
  return `${activityType} run ${workflowExecution?.workflowId ?? '-'}${step === undefined ? '' : ` step ${step}`} attempt ${attempt}`;
}

/** The interceptor factory of a worker's `interceptors.activity`. */
export const logActivities: ActivityInterceptorsFactory = (ctx) => {
  const inbound: ActivityInboundCallsInterceptor = {
    async execute(input, next) {
      const head = activityHead(ctx, input.args);
      const t0 = Date.now();
      const seconds = () => ((Date.now() - t0) / 1000).toFixed(1);
      ctx.log.info(`${head}: started`);
      try {
        const result = await next(input);
        ctx.log.info(`${head}: done in ${seconds()} s`);
        return result;
      } catch (e) {
        ctx.log.info(`${head}: failed after ${seconds()} s: ${(e as Error).message?.split('\n')[0] ?? String(e)}`);
        throw e;
      }
    },
  };
  return { inbound };
};
