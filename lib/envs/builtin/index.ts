/** The environments that ship with prime-rl, by id. */
import type { EnvironmentDefinition } from '../define';
import arithmetic from './arithmetic';
import calculator from './calculator';
import guessNumber from './guess-number';
import reverseText from './reverse-text';

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- environments of any argument and state types
export const BUILTIN_ENVIRONMENTS: Readonly<Record<string, EnvironmentDefinition<any, any>>> = {
  'reverse-text': reverseText,
  arithmetic,
  'guess-number': guessNumber,
  calculator,
};
