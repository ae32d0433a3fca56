"""Our reference contracts on a chain: their compiled artifacts, ABI codec and signed sends.

``contracts/artifacts/<Name>.json`` (``make contracts``) hold each contract's ABI and bytecode.
``Chain`` sends EIP-1559 transactions signed with eth-account: gas is estimated first (so a
revert raises ``Reverted`` with the decoded error, before anything is sent), priced at twice
the base fee plus a fixed tip (doubling ``eth_gasPrice`` would double anvil's price on every
transaction), and the receipt is polled for, since anvil answers ``eth_sendRawTransaction``
before the block exists. ``Contract`` calls, sends and decodes events by function name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from eth_abi import abi as codec
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.abi import (
    collapse_if_tuple,
    event_abi_to_log_topic,
    function_abi_to_4byte_selector,
    get_abi_input_types,
    get_abi_output_types,
)
from eth_utils.address import to_checksum_address

from tests.support.chain.rpc import Rpc, RpcError
from tests.support.server import ROOT

ARTIFACTS = ROOT / "contracts" / "artifacts"
TIP_WEI = 10**9
RECEIPT_TIMEOUT_SECONDS = 30.0
# anvil's first dev account (its default mnemonic), funded with 10,000 ETH at start.
DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"

JsonObject = dict[str, Any]
# One element of a JSON ABI. eth_utils types them as TypedDicts per kind; read from artifacts
# they are plain JSON, so they stay untyped here.
AbiEntry = Any
Block = str | int | JsonObject


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[AbiEntry]
    bytecode: str
    deployed_bytecode: str


@functools.cache
def artifact(name: str) -> Artifact:
    """The compiled contract ``name`` (``Token``, ``FlowProtocol``, ...)."""
    data = json.loads((ARTIFACTS / f"{name}.json").read_text(encoding="utf-8"))
    return Artifact(name, data["abi"], data["bytecode"], data["deployedBytecode"])


@dataclass(frozen=True)
class Event:
    """A decoded log; ``event["user"]`` reads an argument."""

    name: str
    args: JsonObject
    address: str
    block_number: int
    block_hash: str
    log_index: int
    tx_hash: str

    def __getitem__(self, key: str) -> Any:
        return self.args[key]


@dataclass(frozen=True)
class Receipt:
    tx_hash: str
    block_number: int
    block_hash: str
    gas_used: int
    contract_address: str | None
    logs: list[JsonObject]


class Reverted(Exception):
    """A call or transaction reverted: ``error`` is the custom error's name (``Error`` for a
    reason string, ``Panic`` for a panic code) and ``values`` its decoded arguments."""

    def __init__(self, error: str, args: tuple[Any, ...]) -> None:
        super().__init__(f"{error}{args!r}")
        self.error = error
        self.values = args


_BUILTIN_ERRORS: list[AbiEntry] = [
    {"type": "error", "name": "Error", "inputs": [{"type": "string", "name": "reason"}]},
    {"type": "error", "name": "Panic", "inputs": [{"type": "uint256", "name": "code"}]},
]


@functools.cache
def _errors() -> dict[bytes, AbiEntry]:
    """Every error any of our contracts may raise, by selector: reverts bubble up across
    contracts, so the callee's ABI is not always the one that knows the error."""
    entries = [entry for path in sorted(ARTIFACTS.glob("*.json"))
               for entry in artifact(path.stem).abi if entry["type"] == "error"]
    return {function_abi_to_4byte_selector(entry): entry
            for entry in _BUILTIN_ERRORS + entries}


def _as_reverted(error: RpcError) -> Reverted | None:
    """The revert an ``eth_call`` / ``eth_estimateGas`` error carries, if it is one."""
    data = error.data if isinstance(error.data, str) else ""
    raw = bytes.fromhex(data.removeprefix("0x"))
    entry = _errors().get(raw[:4])
    if entry is None:
        return Reverted("unknown", (data,)) if "revert" in error.message else None
    return Reverted(entry["name"], tuple(codec.decode(get_abi_input_types(entry), raw[4:])))


def _checksummed(param: AbiEntry, value: Any) -> Any:
    """``value`` with every address in checksum form (eth_abi decodes them lowercase)."""
    kind: str = param["type"]
    if kind.endswith("]"):
        inner = {**param, "type": kind[:kind.rindex("[")]}
        return tuple(_checksummed(inner, item) for item in value)
    if kind == "tuple":
        return tuple(_checksummed(component, item)
                     for component, item in zip(param["components"], value, strict=True))
    return to_checksum_address(value) if kind == "address" else value


class Abi:
    """Encoding and decoding by name for one contract's ABI (our contracts overload nothing)."""

    def __init__(self, entries: list[AbiEntry]) -> None:
        self.functions: dict[str, AbiEntry] = {
            entry["name"]: entry for entry in entries if entry["type"] == "function"}
        self.events: dict[str, AbiEntry] = {
            entry["name"]: entry for entry in entries if entry["type"] == "event"}
        self.constructor: AbiEntry = next(
            (entry for entry in entries if entry["type"] == "constructor"),
            {"type": "constructor", "inputs": []})

    def encode_call(self, function: str, args: tuple[Any, ...]) -> str:
        entry = self.functions[function]
        encoded = codec.encode(get_abi_input_types(entry), args)
        return "0x" + (function_abi_to_4byte_selector(entry) + encoded).hex()

    def encode_constructor(self, args: tuple[Any, ...]) -> bytes:
        return codec.encode(get_abi_input_types(self.constructor), args)

    def decode_result(self, function: str, data: str | bytes) -> Any:
        """The outputs of ``function`` (from hex or raw bytes): the value itself when there is
        one, else a tuple."""
        outputs = self.functions[function]["outputs"]
        raw = bytes.fromhex(data.removeprefix("0x")) if isinstance(data, str) else data
        values = codec.decode(get_abi_output_types(self.functions[function]), raw)
        decoded = tuple(_checksummed(param, value)
                        for param, value in zip(outputs, values, strict=True))
        return decoded[0] if len(decoded) == 1 else decoded

    def decode_log(self, name: str, log: JsonObject) -> Event | None:
        """``log`` as event ``name``, or None when it is another event."""
        entry = self.events[name]
        topics: list[str] = log["topics"]
        if not topics or topics[0] != "0x" + event_abi_to_log_topic(entry).hex():
            return None
        indexed = [param for param in entry["inputs"] if param["indexed"]]
        plain = [param for param in entry["inputs"] if not param["indexed"]]
        args = {param["name"]: _checksummed(param, codec.decode(
                    [param["type"]], bytes.fromhex(topic.removeprefix("0x")))[0])
                for param, topic in zip(indexed, topics[1:], strict=True)}
        values = codec.decode([collapse_if_tuple(param) for param in plain],
                                bytes.fromhex(log["data"].removeprefix("0x")))
        args.update({param["name"]: _checksummed(param, value)
                     for param, value in zip(plain, values, strict=True)})
        return Event(name, args, to_checksum_address(log["address"]),
                     int(log["blockNumber"], 16), log["blockHash"], int(log["logIndex"], 16),
                     log["transactionHash"])


@functools.cache
def abi_of(name: str) -> Abi:
    return Abi(artifact(name).abi)


def _block_param(block: Block) -> Block:
    return hex(block) if isinstance(block, int) else block


class Chain:
    """A connected chain: its JSON-RPC client, its id, and anvil's funded dev account."""

    def __init__(self, rpc: Rpc, chain_id: int) -> None:
        self.rpc = rpc
        self.chain_id = chain_id
        self.deployer: LocalAccount = Account.from_key(DEV_KEY)

    def contract(self, name: str, address: str) -> Contract:
        return Contract(self, name, address)

    async def new_account(self, wei: int = 100 * 10**18) -> LocalAccount:
        """A fresh key holding ``wei`` of native currency (set with ``anvil_setBalance``)."""
        account: LocalAccount = Account.create()
        await self.rpc.call("anvil_setBalance", account.address, hex(wei))
        return account

    async def deploy(self, name: str, *args: Any) -> Contract:
        """Deploy ``name`` with constructor ``args`` from the dev account."""
        data = artifact(name).bytecode + abi_of(name).encode_constructor(args).hex()
        receipt = await self.send(self.deployer, None, data)
        assert receipt.contract_address is not None, receipt
        return self.contract(name, receipt.contract_address)

    async def send(self, sender: LocalAccount, to: str | None, data: str, value: int = 0
                   ) -> Receipt:
        """Sign and send a transaction; return its receipt once mined.

        :raises Reverted: it would revert (checked by estimating its gas).
        :raises RuntimeError: it was mined but failed anyway.
        """
        call: JsonObject = {"from": sender.address, "data": data, "value": hex(value)}
        if to is not None:
            call["to"] = to
        gas, nonce, block = await self.rpc.batch([
            ("eth_estimateGas", [call]),
            ("eth_getTransactionCount", [sender.address, "pending"]),
            ("eth_getBlockByNumber", ["latest", False])])
        for answer in (gas, nonce, block):
            if isinstance(answer, RpcError):
                raise _as_reverted(answer) or answer
        transaction: JsonObject = {
            "type": 2, "chainId": self.chain_id, "nonce": int(nonce, 16), "value": value,
            "data": data, "gas": int(gas, 16) * 5 // 4, "maxPriorityFeePerGas": TIP_WEI,
            "maxFeePerGas": 2 * int(block["baseFeePerGas"], 16) + TIP_WEI}
        if to is not None:
            transaction["to"] = to
        signed = Account.sign_transaction(transaction, sender.key)
        tx_hash = await self.rpc.call("eth_sendRawTransaction",
                                      "0x" + signed.raw_transaction.hex().removeprefix("0x"))
        receipt = await self.wait_receipt(tx_hash)
        if receipt["status"] != "0x1":
            raise RuntimeError(f"transaction {tx_hash} failed when mined: {receipt}")
        return Receipt(tx_hash, int(receipt["blockNumber"], 16), receipt["blockHash"],
                       int(receipt["gasUsed"], 16), receipt.get("contractAddress"),
                       receipt["logs"])

    async def wait_receipt(self, tx_hash: str, timeout: float = RECEIPT_TIMEOUT_SECONDS
                           ) -> JsonObject:
        """Poll until ``tx_hash`` has a receipt (null until its block exists)."""
        with trio.fail_after(timeout):
            while True:
                receipt: JsonObject | None = await self.rpc.call("eth_getTransactionReceipt",
                                                                 tx_hash)
                if receipt is not None:
                    return receipt
                await trio.sleep(0.01)

    async def call(self, to: str, data: str, block: Block = "latest") -> str:
        """``eth_call``; ``block`` is a number, a tag or an EIP-1898 object.

        :raises Reverted: the call reverted.
        """
        try:
            result: str = await self.rpc.call("eth_call", {"to": to, "data": data},
                                              _block_param(block))
        except RpcError as error:
            raise _as_reverted(error) or error from None
        return result


@asynccontextmanager
async def open_chain(url: str) -> AsyncIterator[Chain]:
    """A ``Chain`` on the node at ``url`` (its id asked once), closed at the end."""
    async with Rpc(url) as rpc:
        yield Chain(rpc, int(await rpc.call("eth_chainId"), 16))


class Contract:
    """One deployed contract: ``await token.call("balanceOf", holder)``,
    ``await token.transact(owner, "approve", spender, amount)``,
    ``token.events(receipt, "Transfer")``."""

    def __init__(self, chain: Chain, name: str, address: str) -> None:
        self.chain = chain
        self.name = name
        self.address = to_checksum_address(address)
        self.abi = abi_of(name)

    def __repr__(self) -> str:
        return f"<{self.name} at {self.address}>"

    def encode(self, function: str, *args: Any) -> str:
        """The calldata of ``function(args)`` (for a multicall, say)."""
        return self.abi.encode_call(function, args)

    def decode(self, function: str, data: str | bytes) -> Any:
        return self.abi.decode_result(function, data)

    async def call(self, function: str, *args: Any, block: Block = "latest") -> Any:
        data = await self.chain.call(self.address, self.encode(function, *args), block)
        return self.decode(function, data)

    async def transact(self, sender: LocalAccount, function: str, *args: Any, value: int = 0
                       ) -> Receipt:
        return await self.chain.send(sender, self.address, self.encode(function, *args), value)

    def events(self, source: Receipt | list[JsonObject], name: str) -> list[Event]:
        """The ``name`` events this contract emitted in a receipt (or a list of raw logs)."""
        logs = source.logs if isinstance(source, Receipt) else source
        mine = [log for log in logs if to_checksum_address(log["address"]) == self.address]
        return [event for log in mine if (event := self.abi.decode_log(name, log)) is not None]
