/**
 * `defineEnvironment`: how an environment is written (one file: args schema + create), and
 * `instantiate`, which validates args and fills the defaults to give an `Environment`.
 *
 *   export default defineEnvironment({
 *     name: 'my-env',
 *     args: z.strictObject({ difficulty: z.number().default(1) }),
 *     create: (args) => ({ dataset: generatedDataset({...}), rubric: [{ name: 'correct', fn: ... }] }),
 *   });
 */
import { z } from 'zod';
import { lastAssistantText } from './parse';
import { checkRubric, scoreRubric } from './rubric';
import { parseToolCalls, runToolCalls, toolSchema, type Tool } from './tools';
import type { Dataset, EnvResponse, Environment, Example, JsonObject, Message, Rubric, TurnContext } from './types';

/** What `create(args)` returns. Only `dataset` and `rubric` are required. */
export interface EnvironmentSetup<S extends JsonObject = JsonObject> {
  dataset: Dataset;
  rubric: Rubric<S>;
  /** Assistant turns at most. Default: 1 for single-turn envs, 10 when `respond` or `tools` is given. */
  maxTurns?: number;
  /**
   * Tools the model may call. Without `respond`, the env runs the tool calls of each assistant
   * turn and answers with their results; a turn without tool calls ends the rollout.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- tools of any argument type
  tools?: Tool<any>[];
  /**
   * Initial rollout state (default `{}`). Annotate its return type (`(): { tries: number } => ...`)
   * and TypeScript infers the state type that `respond` and the rubric see.
   */
  init?(example: Example): S;
  /** The env's answer to each model turn. Default: tool handling with `tools`, else done. */
  respond?(ctx: TurnContext<S>): EnvResponse<S> | Promise<EnvResponse<S>>;
  /**
   * The reference assistant turn(s) that solve `example` (appended to its prompt), for supervised
   * fine-tuning on the env's own data (`prime-rl sft` with `data.env`). Optional: an env without it
   * can be trained with RL but not used as an SFT data source.
   */
  demonstration?(example: Example): Message[];
}

export interface EnvironmentDefinition<T extends z.ZodType = z.ZodType, S extends JsonObject = JsonObject> {
  name: string;
  description?: string;
  /** Schema of the `[[env]] args` table; use `z.strictObject` so misspelt args are errors. */
  args: T;
  create(args: z.output<T>): EnvironmentSetup<S>;
}

/** Identity at runtime; gives the definition its types (args inferred from the schema). */
export function defineEnvironment<T extends z.ZodType, S extends JsonObject = JsonObject>(
  def: EnvironmentDefinition<T, S>,
): EnvironmentDefinition<T, S> {
  return def;
}

/** Duck-typed, so definitions made with another copy of this package (an npm env) are accepted. */
export function isEnvironmentDefinition(value: unknown): value is EnvironmentDefinition {
  const v = value as Partial<EnvironmentDefinition> | null;
  return (
    typeof v === 'object' &&
    v !== null &&
    typeof v.name === 'string' &&
    typeof v.create === 'function' &&
    typeof (v.args as { safeParse?: unknown } | undefined)?.safeParse === 'function'
  );
}

function describeIssues(error: z.ZodError): string {
  return error.issues
    .map((issue) => `${issue.path.length > 0 ? issue.path.join('.') : '(args)'}: ${issue.message}`)
    .join('; ');
}

const DEFAULT_MULTI_TURN = 10;

/** Validates `args` against the definition's schema and builds the environment; `id` names it in errors. */
export function instantiate(def: EnvironmentDefinition, args: unknown, id: string): Environment {
  const parsed = def.args.safeParse(args ?? {});
  if (!parsed.success) throw new Error(`environment "${id}": invalid args: ${describeIssues(parsed.error)}`);
  const setup = def.create(parsed.data);
  const where = `environment "${id}"`;
  checkRubric(setup.rubric, where);
  const tools = setup.tools ?? [];
  const names = new Set(tools.map((t) => t.name));
  if (names.size !== tools.length) throw new Error(`${where}: tool names must be unique`);
  const multiTurn = setup.respond !== undefined || tools.length > 0;
  const maxTurns = setup.maxTurns ?? (multiTurn ? DEFAULT_MULTI_TURN : 1);
  if (!Number.isInteger(maxTurns) || maxTurns < 1)
    throw new Error(`${where}: maxTurns must be a positive integer, got ${maxTurns}`);

  const respond =
    setup.respond ??
    (tools.length > 0
      ? async (ctx: TurnContext): Promise<EnvResponse> => {
          const calls = parseToolCalls(lastAssistantText(ctx.messages));
          if (calls.length === 0) return { done: true };
          return { messages: await runToolCalls(tools, calls), done: false };
        }
      : (): EnvResponse => ({ done: true }));

  return {
    name: def.name,
    maxTurns,
    tools: tools.map(toolSchema),
    dataset: setup.dataset,
    init: setup.init ?? (() => ({})),
    respond,
    score: (ctx) => scoreRubric(setup.rubric, ctx),
    demonstration: setup.demonstration,
  };
}
