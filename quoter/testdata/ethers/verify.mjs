// Independent check of a quoter quote with ethers v6: recomputes the
// EIP-712 digest and recovers the signer from the published JSON alone.
// Usage: node verify.mjs FILE   (exit 0 = valid, 1 = invalid, 2 = usage)
import { readFileSync } from "node:fs";
import { TypedDataEncoder, verifyTypedData, getAddress } from "ethers";

if (process.argv.length !== 3) {
  console.error("usage: node verify.mjs FILE");
  process.exit(2);
}
const fail = (msg) => {
  console.error(`INVALID: ${msg}`);
  process.exit(1);
};
let q;
try {
  q = JSON.parse(readFileSync(process.argv[2], "utf8"));
} catch (e) {
  fail(`cannot read quote: ${e.message}`);
}
if (q.primaryType !== "CapacityQuote") fail(`primaryType ${q.primaryType}`);
if ("EIP712Domain" in q.types) fail("types must not include EIP712Domain");
let digest, recovered;
try {
  digest = TypedDataEncoder.hash(q.domain, q.types, q.message);
  recovered = verifyTypedData(q.domain, q.types, q.message, q.signature);
} catch (e) {
  fail(`ethers rejected the typed data: ${e.message}`);
}
if (digest !== q.digest.toLowerCase()) fail(`digest ${digest} != published ${q.digest}`);
if (recovered !== getAddress(q.signer)) fail(`recovered ${recovered} != signer ${q.signer}`);
if (recovered !== getAddress(q.message.provider)) fail(`recovered ${recovered} != provider ${q.message.provider}`);
const v = parseInt(q.signature.slice(-2), 16);
if (q.signature.length !== 132 || (v !== 27 && v !== 28)) fail(`signature is not 65 bytes with v=27/28`);
console.log(`VALID ${recovered} seq=${q.message.seq}`);
