/**
 * Large response bodies without blocking the event loop. A non-streamed completion of n = 64 x
 * 2,000 tokens with 20 top logprobs each is millions of entries: built and serialised in one go,
 * it held `/health` and every other request for seconds. Here the heavy parts of a body are
 * `LazyArray`s, whose items are made while the body is written, and `sendJson` writes the body in
 * pieces, giving the event loop back every few milliseconds; a client that leaves stops it.
 */
import { Readable } from 'node:stream';
import type { FastifyReply } from 'fastify';

/** An array whose items are made as they are written (each a small value), not all up front. */
export class LazyArray<T> {
  constructor(
    readonly length: number,
    readonly item: (i: number) => T,
  ) {}

  /** As a plain array, for JSON.stringify (small bodies, tests). */
  toJSON(): T[] {
    return Array.from({ length: this.length }, (_, i) => this.item(i));
  }
}

/** Work between two returns to the event loop. */
const SLICE_MS = 5;
/** Text handed to the socket at once. */
const PIECE_CHARS = 1 << 16;
/** Elements of an array of numbers or strings serialised in one JSON.stringify call. */
const PRIMITIVES_AT_ONCE = 1 << 14;

/** JSON.stringify's text of `value`, in pieces (see the top of this file). */
export async function* jsonPieces(value: unknown): AsyncGenerator<string> {
  let piece = '';
  let since = performance.now();
  // A synchronous walk that appends to `piece`; the async loop below drains it and yields time.
  function* walk(v: unknown): Generator<void> {
    if (v instanceof LazyArray) {
      piece += '[';
      // Each item is small: natively, whole (a LazyArray inside one is expanded by its toJSON).
      for (let i = 0; i < v.length; i++) {
        piece += `${i > 0 ? ',' : ''}${JSON.stringify(v.item(i)) ?? 'null'}`;
        yield;
      }
      piece += ']';
    } else if (Array.isArray(v)) {
      if (v.length > 0 && (typeof v[0] !== 'object' || v[0] === null)) {
        // Numbers or strings: many at once, natively.
        piece += '[';
        for (let i = 0; i < v.length; i += PRIMITIVES_AT_ONCE) {
          if (i > 0) piece += ',';
          piece += JSON.stringify(v.slice(i, i + PRIMITIVES_AT_ONCE)).slice(1, -1);
          yield;
        }
        piece += ']';
      } else {
        piece += '[';
        for (let i = 0; i < v.length; i++) {
          if (i > 0) piece += ',';
          yield* walk(v[i] === undefined ? null : v[i]);
        }
        piece += ']';
      }
    } else if (v !== null && typeof v === 'object' && typeof (v as { toJSON?: unknown }).toJSON !== 'function') {
      piece += '{';
      let first = true;
      for (const [k, x] of Object.entries(v)) {
        if (x === undefined || typeof x === 'function') continue;
        piece += `${first ? '' : ','}${JSON.stringify(k)}:`;
        first = false;
        yield* walk(x);
      }
      piece += '}';
    } else {
      piece += JSON.stringify(v) ?? 'null';
    }
  }
  for (const _ of walk(value)) {
    if (piece.length >= PIECE_CHARS) {
      yield piece;
      piece = '';
    }
    if (performance.now() - since >= SLICE_MS) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      since = performance.now();
    }
  }
  yield piece;
}

/** Sends `body` as JSON in pieces (chunked); returns the reply, for a route to return. */
export function sendJson(reply: FastifyReply, body: unknown): FastifyReply {
  reply.header('content-type', 'application/json; charset=utf-8');
  return reply.send(Readable.from(jsonPieces(body), { objectMode: false }));
}

/** `Array.from({length}, fn)`, giving the event loop back every few milliseconds. */
export async function mapInSlices<T>(length: number, fn: (i: number) => T): Promise<T[]> {
  const out = new Array<T>(length);
  let since = performance.now();
  for (let i = 0; i < length; i++) {
    out[i] = fn(i);
    if (performance.now() - since >= SLICE_MS) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      since = performance.now();
    }
  }
  return out;
}
