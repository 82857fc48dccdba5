// The official Node client (openai 7.59.0) through the gateway: Responses API
// streamed and not, chat, completions, embeddings. Prints one line per
// call; exits non-zero on the first failure. Usage: node sdk.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused" });

const r = await client.responses.create({ model, instructions: "You are terse.", input: "Say one word." });
if (!r.id || !r.output_text) throw new Error("responses.create: empty answer");
console.log("responses.create", r.id);

const stream = await client.responses.create({ model, input: "Say two words.", stream: true });
let events = 0, text = "";
for await (const ev of stream) {
  events++;
  if (ev.type === "response.output_text.delta") text += ev.delta;
}
if (events < 2 || !text) throw new Error(`responses.create stream: ${events} events, text ${JSON.stringify(text)}`);
console.log("responses.create stream", events);

const cc = await client.chat.completions.create({ model, messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "hi" }] });
if (!cc.choices.length) throw new Error("chat.completions.create: no choice");
console.log("chat.completions.create", cc.choices[0].finish_reason);

const co = await client.completions.create({ model, prompt: "once upon a time" });
if (!co.choices.length) throw new Error("completions.create: no choice");
console.log("completions.create", co.choices[0].finish_reason);

const emb = await client.embeddings.create({ model, input: "a sentence to embed" });
if (!emb.data.length) throw new Error("embeddings.create: no data");
console.log("embeddings.create", emb.data[0].embedding.length);
