/**
 * Strict typed access to the fields of a Hugging Face `config.json`; every error names the file
 * and the field. Shared by `hf-config.ts` (common fields) and the family modules (their own).
 */
export type Json = Record<string, unknown>;

/** A config.json value that cannot be used: `file` and `field` say which (the message says both). */
export class ModelConfigError extends Error {
  override readonly name = 'ModelConfigError';
  constructor(
    readonly file: string,
    readonly field: string,
    why: string,
  ) {
    super(`${file}: field '${field}' ${why}`);
  }
}

export class ConfigReader {
  constructor(
    readonly raw: Json,
    private readonly source: string,
  ) {}

  fail(field: string, why: string): never {
    throw new ModelConfigError(this.source, field, why);
  }

  /** Absent and JSON null both mean "use the default", as in transformers. */
  has(field: string): boolean {
    return this.raw[field] !== undefined && this.raw[field] !== null;
  }

  posInt(field: string, fallback?: number): number {
    if (!this.has(field)) {
      if (fallback === undefined) this.fail(field, 'is required');
      return fallback;
    }
    const v = this.raw[field];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0)
      this.fail(field, `must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  }

  posNumber(field: string, fallback: number, from: Json = this.raw, label = field): number {
    const v = from[field];
    if (v === undefined || v === null) return fallback;
    if (typeof v !== 'number' || !(v > 0) || !Number.isFinite(v))
      this.fail(label, `must be a positive number, got ${JSON.stringify(v)}`);
    return v;
  }

  bool(field: string, fallback: boolean): boolean {
    if (!this.has(field)) return fallback;
    const v = this.raw[field];
    if (typeof v !== 'boolean') this.fail(field, `must be a boolean, got ${JSON.stringify(v)}`);
    return v;
  }

  /** A list of distinct non-negative integers (e.g. layer indices). */
  intList(field: string, fallback: number[]): number[] {
    if (!this.has(field)) return fallback;
    const v = this.raw[field];
    if (!Array.isArray(v) || v.some((x) => typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0))
      this.fail(field, `must be an array of non-negative integers, got ${JSON.stringify(v)}`);
    if (new Set(v).size !== v.length) this.fail(field, `has duplicates: ${JSON.stringify(v)}`);
    return v as number[];
  }
}
