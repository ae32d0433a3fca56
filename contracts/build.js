// Compiles contracts/*.sol with solc's JS API (standard JSON) into contracts/artifacts/<Name>.json:
// abi, bytecode (creation) and deployedBytecode (runtime, for anvil_setCode). `make contracts`.
// The solc CLI can set neither the EVM version nor emit runtime bytecode, hence this script.
"use strict";

const fs = require("fs");
const path = require("path");
const solc = require("solc");

// anvil runs later hardforks too; cancun keeps the bytecode valid on BSC-like chains.
const EVM_VERSION = "cancun";
const here = __dirname;
const artifacts = path.join(here, "artifacts");

const sources = {};
for (const file of fs.readdirSync(here).filter((name) => name.endsWith(".sol")).sort()) {
  sources[file] = { content: fs.readFileSync(path.join(here, file), "utf8") };
}

const input = {
  language: "Solidity",
  sources,
  settings: {
    evmVersion: EVM_VERSION,
    optimizer: { enabled: true, runs: 200 },
    // userState's nine return values and the tokenInfo getter are too deep for the legacy pipeline.
    viaIR: true,
    // No metadata hash: a comment-only change leaves the committed bytecode as it is.
    metadata: { bytecodeHash: "none" },
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
  },
};

const output = JSON.parse(solc.compile(JSON.stringify(input)));
const problems = output.errors || [];
for (const problem of problems) console.error(problem.formattedMessage);
// Warnings fail the build too, as they fail the Python tests.
if (problems.length) process.exit(1);

fs.rmSync(artifacts, { recursive: true, force: true });
fs.mkdirSync(artifacts);
for (const [sourceName, contracts] of Object.entries(output.contracts)) {
  for (const [name, contract] of Object.entries(contracts)) {
    if (!contract.evm.bytecode.object) continue; // an interface: nothing to deploy
    const artifact = {
      contractName: name,
      sourceName,
      compiler: solc.version(),
      evmVersion: EVM_VERSION,
      abi: contract.abi,
      bytecode: "0x" + contract.evm.bytecode.object,
      deployedBytecode: "0x" + contract.evm.deployedBytecode.object,
    };
    fs.writeFileSync(path.join(artifacts, `${name}.json`), JSON.stringify(artifact, null, 2) + "\n");
    console.log(`${name}: ${contract.evm.deployedBytecode.object.length / 2} bytes deployed`);
  }
}
