/** One GPU check (bench/gpu/checks.ts lists them): what it runs in, what it returns. */
export interface CheckContext {
  /** 'cuda', 'cuda:N' or 'cpu'. */
  device: string;
  /** A scratch folder the checks may fill. */
  workDir: string;
  /** The Python with torch and transformers (default python3). */
  python: string;
}

export interface CheckResult {
  status: 'pass' | 'fail' | 'skip';
  /** What was measured against what bound, or why it was skipped. */
  detail: string;
}

export interface Check {
  name: string;
  run(ctx: CheckContext): Promise<CheckResult>;
}

/** Pass or fail, with what was measured. */
export const verdict = (ok: boolean, detail: string): CheckResult => ({ status: ok ? 'pass' : 'fail', detail });
