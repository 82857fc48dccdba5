// The OpenAI API's long tail with the official Node client (openai 7.59.0)
// through a front over round-robin engines (e2e/openai_tail_test.go runs
// it): embeddings with arrays, n=3 not streamed, a stored response's
// retrieve and delete reaching the engine that produced it, an unknown id
// answered 404 by the front. Prints one line per check; exits non-zero on
// the first failure. Usage: node tail.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const header = (h, k) => (h && typeof h.get === "function" ? h.get(k) : h?.[k]);

for (const [name, input, want] of [["strings", ["a", "b"], 2], ["tokens", [1, 2, 3], 1], ["token arrays", [[1, 2], [3]], 2]]) {
  const emb = await client.embeddings.create({ model, input });
  if (emb.data.length !== want) throw new Error(`embeddings ${name}: ${emb.data.length} embeddings, want ${want}`);
  console.log("embeddings", name, emb.data.length);
}

const cc = await client.chat.completions.create({ model, n: 3, messages: [{ role: "user", content: "three answers, please" }] });
if (cc.choices.length !== 3 || cc.choices.some((c, i) => c.index !== i)) throw new Error(`chat n=3: ${JSON.stringify(cc.choices)}`);
console.log("chat n=3", cc.choices.length);
const co = await client.completions.create({ model, n: 3, prompt: "three endings" });
if (co.choices.length !== 3) throw new Error(`completions n=3: ${co.choices.length} choices`);
console.log("completions n=3", co.choices.length);

const { data: r, response } = await client.responses.create({ model, input: "store this one" }).withResponse();
const owner = response.headers.get("x-exa-replica");
if (!r.id || !owner) throw new Error(`responses.create: id ${r.id}, replica ${owner}`);

// expectError runs call, which must fail; returns the error.
async function expectError(what, call) {
  try {
    await call();
  } catch (err) {
    return err;
  }
  throw new Error(`${what}: no error`);
}
for (const [what, call] of [["retrieve", () => client.responses.retrieve(r.id)], ["delete", () => client.responses.delete(r.id)]]) {
  const err = await expectError(what, call);
  const served = header(err.headers, "x-exa-replica");
  if (err.status !== 404 || err.code === "response_not_found" || served !== owner)
    throw new Error(`${what}: status ${err.status}, code ${err.code}, served by ${served}, want the engine's 404 from ${owner}`);
  console.log(what, "engine", err.status, served);
}
const err = await expectError("retrieve unknown", () => client.responses.retrieve("resp_never_seen"));
if (err.status !== 404 || err.code !== "response_not_found" || !String(err.message).includes("resp_never_seen"))
  throw new Error(`retrieve unknown: status ${err.status}, code ${err.code}, ${err.message}`);
console.log("retrieve unknown", err.status, err.code);
