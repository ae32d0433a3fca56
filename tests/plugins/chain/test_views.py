"""Typed views and Multicall3 batching, checked against eth_abi and web3."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import decode, encode
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from plugins.chain import views
from plugins.chain.abi import AbiDecodeError
from plugins.chain.contracts import MULTICALL3, MULTICALL3_ADDRESS
from plugins.chain.views import (
    Call3,
    Ecosystem,
    Reserves,
    Result3,
    TokenData,
    TokenInfo,
    UserState,
    aggregate3_call_data,
    decode_aggregate3,
)
from tests.plugins.chain.abi_samples import web3_contract

USER = to_checksum_address("0x" + "5a" * 20)
TOKEN = to_checksum_address("0x" + "7c" * 20)


def address(byte: int) -> str:
    return to_checksum_address("0x" + f"{byte:02x}" * 20)


# Each view by the canonical signature chain.md gives it.
SIGNATURES = {
    "POOL_USDT": "poolUSDT()", "PRICE_FLOW": "priceFLOW()",
    "INCOME_LIMIT": "incomeLimit(address)", "LIFETIME_INCOME_LIMIT": "lifetimeIncomeLimit(address)",
    "IS_ACTIVATED": "isActivated(address)", "PENDING_GWT": "pendingGWT(address)",
    "DAILY_LIMIT_MAX": "dailyLimitMax()", "USER_STATE": "userState(address)",
    "PROTOCOL_USDT": "usdt()", "PROTOCOL_FLOW": "flow()", "PROTOCOL_GWT": "gwt()",
    "PROTOCOL_TREE": "tree()", "PROTOCOL_TREASURY": "treasury()",
    "GET_PARENT": "getParent(address)", "GET_CHILD": "getChild(address,uint256)",
    "GET_SUBTREE_SIZE": "getSubtreeSize(address)", "GET_DEPTH": "getDepth(address)",
    "ACTIVE_UNTIL": "activeUntil(address)", "IS_ACTIVE": "isActive(address)",
    "TREE_ROOT": "root()", "BALANCE_OF": "balanceOf(address)", "TOTAL_SUPPLY": "totalSupply()",
    "DECIMALS": "decimals()", "ECOSYSTEM": "ecosystem()", "TOKEN_INFO": "tokenInfo(address)",
    "GRAD_THRESHOLD": "gradThreshold()", "GET_RESERVES": "getReserves()",
    "PAIR_BALANCE": "balance()", "PAIR_ASSET_BALANCE": "assetBalance()",
}


@pytest.mark.parametrize(("name", "signature"), SIGNATURES.items())
def test_each_view_calls_the_function_chain_md_names(name: str, signature: str) -> None:
    view = getattr(views, name)
    kinds = signature[signature.index("(") + 1:-1].split(",")
    args = [USER if kind == "address" else 2 for kind in kinds if kind]
    call_data = view.encode(*args)
    assert call_data[:4] == keccak(text=signature)[:4]
    assert view.call3(TOKEN, *args) == Call3(TOKEN, True, call_data)


@pytest.mark.parametrize(("view", "kinds", "values", "typed"), [
    (views.POOL_USDT, ["uint256"], [12_345 * 10**18 + 1], 12_345 * 10**18 + 1),
    (views.IS_ACTIVATED, ["bool"], [True], True),
    (views.DECIMALS, ["uint8"], [18], 18),
    (views.GET_PARENT, ["address"], ["0x" + "ab" * 20], address(0xAB)),
    (views.USER_STATE, ["bool", "uint256", "uint256", "uint64", "uint256", "uint256", "uint64",
                        "uint256", "uint256"],
     [True, 200 * 10**18, 400 * 10**18, 1_700_000_000, 50 * 10**18, 3, 1_700_086_400,
      1_702_000_000, 10**18 + 1],
     UserState(True, 200 * 10**18, 400 * 10**18, 1_700_000_000, 50 * 10**18, 3,
               1_700_086_400, 1_702_000_000, 10**18 + 1)),
    (views.ECOSYSTEM, ["address"] * 4, [address(1), address(2), address(3), address(4)],
     Ecosystem(address(1), address(2), address(3), address(4))),
    (views.GET_RESERVES, ["uint256", "uint256"], [10**27, 6_000 * 10**18],
     Reserves(10**27, 6_000 * 10**18)),
])
def test_views_decode_into_their_types(view: views.View[Any], kinds: list[str],
                                       values: list[Any], typed: Any) -> None:
    assert view.decode(encode(kinds, values)) == typed


def test_token_info_decodes_with_its_nested_data() -> None:
    data = (address(9), "fun Agent", "Agent", "AGT", 10**27, 3, 4, 5, 6, 7, 8, 1_700_000_000)
    values = (address(1), address(2), address(3), address(4), data, "about", "img.png",
              "tw", "tg", "yt", "web", True, False)
    kinds = ["address"] * 4 + ["(address,string,string,string,uint256,uint256,uint256,uint256,"
                               "uint256,uint256,uint256,uint256)"] + ["string"] * 6 + ["bool"] * 2
    assert views.TOKEN_INFO.decode(encode(kinds, values)) == TokenInfo(
        address(1), address(2), address(3), address(4),
        TokenData(address(9), "fun Agent", "Agent", "AGT", 10**27, 3, 4, 5, 6, 7, 8,
                  1_700_000_000),
        "about", "img.png", "tw", "tg", "yt", "web", True, False)


def test_an_answer_from_an_address_without_code_does_not_decode() -> None:
    # aggregate3 reports success with empty data for a call to an address without code.
    with pytest.raises(AbiDecodeError):
        views.BALANCE_OF.decode(b"")


def test_aggregate3_encodes_as_web3_does_and_round_trips() -> None:
    calls = [views.BALANCE_OF.call3(TOKEN, USER), views.USER_STATE.call3(MULTICALL3_ADDRESS, USER,
                                                                         allow_failure=False)]
    call_data = aggregate3_call_data(calls)
    assert call_data[:4].hex() == "82ad56cb"
    assert aggregate3_call_data([tuple(call) for call in calls]) == call_data  # plain tuples
    contract = web3_contract(MULTICALL3.abi)
    as_tuples = [tuple(call) for call in calls]
    assert "0x" + call_data.hex() == contract.encode_abi("aggregate3", [as_tuples])
    (decoded,) = decode(["(address,bool,bytes)[]"], call_data[4:])
    assert [(to_checksum_address(target), allow, data) for target, allow, data in decoded] == (
        as_tuples)


def test_aggregate3_answers_split_per_call() -> None:
    answer = encode(["(bool,bytes)[]"], [[(True, encode(["uint256"], [7])), (False, b"\x08")]])
    results = decode_aggregate3(answer)
    assert results == [Result3(True, encode(["uint256"], [7])), Result3(False, b"\x08")]
    assert views.BALANCE_OF.decode(results[0].return_data) == 7
    assert decode_aggregate3(encode(["(bool,bytes)[]"], [[]])) == []
    with pytest.raises(AbiDecodeError):
        decode_aggregate3(b"\x00" * 31)
