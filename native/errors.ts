/** The engine's errors as JS sees them (native/src/addon/convert.cc `optionErrorToJs`). */

/**
 * An engine error about one option of a call (native/src/facts.h `OptionError`): `option` names it
 * as the call's options do (`pagedAttentionKernel`), `reason` says what is wrong; the message is
 * `<option>: <reason>`. Tell engine errors apart by `option`, never by their message.
 */
export interface EngineOptionError extends Error {
  option: string;
  reason: string;
}

/** Whether `e` is an engine error about one option (`EngineOptionError`). */
export function isEngineOptionError(e: unknown): e is EngineOptionError {
  return (
    typeof e === 'object' &&
    e !== null &&
    typeof (e as EngineOptionError).option === 'string' &&
    typeof (e as EngineOptionError).reason === 'string'
  );
}
