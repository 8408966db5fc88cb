/**
 * Integer arithmetic shared by the arithmetic and calculator envs: random problems, and an exact
 * evaluator (BigInt, so long products never lose digits) for the problems and the calculator tool.
 */
import { pick, uniformInt, type Rng } from '../random';

export const OPERATORS = ['+', '-', '*'] as const;
export type Operator = (typeof OPERATORS)[number];

export interface ProblemShape {
  /** Operands per problem, drawn uniformly from [minOperands, maxOperands]. */
  minOperands: number;
  maxOperands: number;
  /** Digits per operand, drawn uniformly from [1, digits]. */
  digits: number;
  operators: readonly Operator[];
}

/** A random problem such as `37 - 4 * 12`, operands without leading zeros. */
export function randomExpression(rng: Rng, shape: ProblemShape): string {
  const n = uniformInt(rng, shape.minOperands, shape.maxOperands);
  const operand = () => {
    const d = uniformInt(rng, 1, shape.digits);
    return String(d === 1 ? uniformInt(rng, 0, 9) : uniformInt(rng, 10 ** (d - 1), 10 ** d - 1));
  };
  let expr = operand();
  for (let i = 1; i < n; i++) expr += ` ${pick(rng, shape.operators)} ${operand()}`;
  return expr;
}

/** Longest expression the evaluator accepts: bounds the work a calculator call can cause. */
export const MAX_EXPRESSION_CHARS = 200;

/**
 * Evaluates integers, `+ - *`, unary minus and parentheses with the usual precedence.
 * Throws an Error with a short reason on anything else.
 */
export function evaluate(expression: string): bigint {
  if (expression.length > MAX_EXPRESSION_CHARS)
    throw new Error(`expression longer than ${MAX_EXPRESSION_CHARS} characters`);
  const tokens = expression.match(/\d+|[-+*()]|\S/g) ?? [];
  let pos = 0;
  const peek = () => tokens[pos];
  const fail = (what: string): never => {
    throw new Error(what);
  };
  // expr := term (('+'|'-') term)*; term := factor ('*' factor)*; factor := '-' factor | int | '(' expr ')'
  const expr = (): bigint => {
    let value = term();
    while (peek() === '+' || peek() === '-') value = tokens[pos++] === '+' ? value + term() : value - term();
    return value;
  };
  const term = (): bigint => {
    let value = factor();
    while (peek() === '*') {
      pos++;
      value *= factor();
    }
    return value;
  };
  const factor = (): bigint => {
    const t = tokens[pos++];
    if (t === undefined) return fail('unexpected end of expression');
    if (t === '-') return -factor();
    if (/^\d+$/.test(t)) return BigInt(t);
    if (t === '(') {
      const value = expr();
      if (tokens[pos++] !== ')') fail('missing )');
      return value;
    }
    return fail(`unexpected "${t}"`);
  };
  const value = expr();
  if (pos < tokens.length) fail(`unexpected "${tokens[pos]}"`);
  return value;
}

/** The integer an answer states (`-12`, `+7`, ` 1,024 `), or undefined when it is not one. */
export function parseInteger(text: string): bigint | undefined {
  const t = text.trim().replace(/,(?=\d{3}\b)/g, '');
  return /^[+-]?\d+$/.test(t) ? BigInt(t) : undefined;
}
