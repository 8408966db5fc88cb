/**
 * The orchestrator's side of the inference servers: token-in `/v1/generate` spread over one or more
 * servers, and making every server serve the policy version a step asks for.
 */

export interface GenerateParams {
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  max_tokens: number;
  seed: number;
}

export interface GenerateResult {
  tokenIds: number[];
  logprobs: number[];
  finishReason: 'stop' | 'length' | 'abort';
  policyVersion: number;
}

/** Where a policy version's weights live: version 0 is the base model the servers started with. */
export interface PolicyRef {
  version: number;
  /** HF folder of the weights; unused for version 0 (reload_weights). */
  weightDir: string;
}

export class InferenceError extends Error {
  constructor(
    message: string,
    /** A 4xx means the request itself is wrong: retrying cannot help. */
    readonly status?: number,
  ) {
    super(message);
  }

  /**
   * The server answered that this request is invalid (a 4xx other than 429): that fails the one
   * rollout. Anything else (unreachable, 5xx, queue full) is the server's state, worth a retry.
   */
  get rejectsRequest(): boolean {
    return this.status !== undefined && this.status >= 400 && this.status < 500 && this.status !== 429;
  }
}

export class InferenceClient {
  private next = 0;

  /** `baseUrls` as in config (`http://host:port/v1`); routes outside /v1 hang off the server root. */
  constructor(
    private readonly baseUrls: readonly string[],
    private readonly timeoutMs = 600_000,
  ) {
    if (baseUrls.length === 0) throw new Error('no inference base URLs configured');
  }

  private root(url: string): string {
    return url.replace(/\/+$/, '').replace(/\/v1$/, '');
  }

  private async call<T>(url: string, init?: { body?: unknown; method?: string }): Promise<T> {
    let res: Response;
    try {
      res = await fetch(url, {
        method: init?.method ?? (init?.body === undefined ? 'GET' : 'POST'),
        headers: { 'content-type': 'application/json' },
        body: init?.body === undefined ? undefined : JSON.stringify(init.body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      throw new InferenceError(`inference server ${url} unreachable: ${(e as Error).message}`);
    }
    const text = await res.text();
    if (!res.ok) {
      let message = text;
      try {
        message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text;
      } catch {
        // not JSON: keep the raw text
      }
      throw new InferenceError(`${url}: HTTP ${res.status}: ${message}`, res.status);
    }
    return JSON.parse(text) as T;
  }

  /** Makes every server serve `policy` (no-op where it already does). */
  async ensurePolicy(policy: PolicyRef): Promise<void> {
    await Promise.all(
      this.baseUrls.map(async (url) => {
        const root = this.root(url);
        const health = await this.call<{ policy_version: number }>(`${root}/health`);
        if (health.policy_version === policy.version) return;
        if (policy.version === 0) await this.call(`${root}/reload_weights`, { body: {} });
        else await this.call(`${root}/update_weights`, { body: { weight_dir: policy.weightDir, version: policy.version } });
      }),
    );
  }

  /** One sequence from `promptIds`; requests rotate over the servers. */
  async generate(promptIds: readonly number[], params: GenerateParams): Promise<GenerateResult> {
    const url = this.baseUrls[this.next++ % this.baseUrls.length];
    const body = await this.call<{
      policy_version: number;
      choices: { token_ids: number[]; logprobs: number[]; finish_reason: 'stop' | 'length' | 'abort' }[];
    }>(`${this.root(url)}/v1/generate`, { body: { prompt_token_ids: promptIds, ...params } });
    const c = body.choices[0];
    return { tokenIds: c.token_ids, logprobs: c.logprobs, finishReason: c.finish_reason, policyVersion: body.policy_version };
  }
}
