/** Request validation of the OpenAI routes (lib/inference/protocol.ts): what a text model cannot take is a 400 naming it. */
import { ApiError, chatCompletionRequest, parseBody } from '../../lib/inference/protocol';

const chat = (content: unknown) => ({ messages: [{ role: 'user', content }] });

function refusal(body: unknown): ApiError {
  try {
    parseBody(chatCompletionRequest, body);
  } catch (e) {
    return e as ApiError;
  }
  throw new Error('accepted');
}

test('text content parts are accepted as text', () => {
  const parsed = parseBody(chatCompletionRequest, chat([{ type: 'text', text: 'hi' }]));
  expect(parsed.messages[0].content).toEqual([{ type: 'text', text: 'hi' }]);
});

test('a vision (or audio) input is a 400 naming the part and its type', () => {
  const e = refusal(
    chat([
      { type: 'text', text: 'what is this?' },
      { type: 'image_url', image_url: { url: 'x' } },
    ]),
  );
  expect(e.status).toBe(400);
  expect(e.message).toBe(
    "messages.0.content.1.type: content part type 'image_url' is not supported: this server runs a text model (no image, audio or video input)",
  );
  expect(refusal(chat([{ type: 'input_audio', input_audio: {} }])).message).toMatch(/'input_audio' is not supported/);
  expect(refusal(chat([{ type: 'text' }])).message).toBe('messages.0.content.0.text: must be a string');
});
