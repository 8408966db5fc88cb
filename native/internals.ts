/**
 * The addon's model object and the call queue behind a NativeModel, for the test-only entry points
 * (testing.ts, checks.ts): private to the production facade (index.ts), which has none.
 */
import type { NativeModel } from './model';
import type { SerialQueue } from './serial';

export function modelInternals(model: NativeModel): { raw: unknown; queue: SerialQueue } {
  return model as unknown as { raw: unknown; queue: SerialQueue };
}
