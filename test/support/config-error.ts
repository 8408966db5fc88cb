/** What a config loader test expects of bad input: a ConfigError (exit 2), and its message. */
import { ConfigError } from '../../lib/failures';

export function configError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}
