"""The hand-read answers of ``plugins.chain.onchain.multicall`` and the hand-written call
data (``views.aggregate3_call_data``, ``abi.Function.encode``) agree with eth_abi's codec
and refuse what it refuses."""

from __future__ import annotations

import pytest
from eth_abi.abi import encode
from eth_abi.exceptions import EncodingError

from plugins.chain.abi import AbiDecodeError
from plugins.chain.contracts import MULTICALL3, PHENOMENAL_TREE
from plugins.chain.onchain.multicall import Answers, Batch, split_aggregate3
from plugins.chain.views import (
    BALANCE_OF,
    GET_PARENT,
    IS_ACTIVE,
    TOKEN_INFO,
    USER_STATE,
    aggregate3_call_data,
    decode_aggregate3,
)

TARGET = "0x" + "ab" * 20


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def test_split_aggregate3_is_decode_aggregate3() -> None:
    returned = [b"", _word(7), _word(1) * 9, b"\x01\x02\x03", _word(2**256 - 1) + b"tail"]
    data = encode(["(bool,bytes)[]"], [[(True, item) for item in returned]])
    assert split_aggregate3(data) == [result.return_data for result in decode_aggregate3(data)]
    assert split_aggregate3(data) == returned
    with pytest.raises(AbiDecodeError):
        split_aggregate3(data[:-40])
    with pytest.raises(AbiDecodeError, match="failed"):
        split_aggregate3(encode(["(bool,bytes)[]"], [[(True, b""), (False, b"")]]))


def test_word_answers_read_as_the_views_decode_them() -> None:
    batch = Batch(TARGET)
    slots = (batch.add(BALANCE_OF, TARGET, TARGET), batch.add(USER_STATE, TARGET, TARGET),
             batch.add(GET_PARENT, TARGET, TARGET), batch.add(IS_ACTIVE, TARGET, TARGET))
    state = encode(["bool"] + ["uint256"] * 2 + ["uint64"] + ["uint256"] * 2 + ["uint64"]
                   + ["uint256"] * 2, [True, 5, 6, 2**64 - 1, 8, 9, 10, 11, 12])
    data = [_word(1), _word(2), _word(3**100), state, encode(["address"], [TARGET]), _word(0)]
    answers = Answers(1, 2, data)
    assert all(slot.words is not None for slot in slots)
    assert [slot.of(answers) for slot in slots] == [
        slot.view.decode(data[slot.index]) for slot in slots]
    for index, bad in ((slots[3].index, _word(2)), (slots[2].index, _word(2**200)),
                       (slots[0].index, b"\x00" * 31)):
        broken = Answers(1, 2, [*data[:index], bad, *data[index + 1:]])
        with pytest.raises(AbiDecodeError):
            slots[[slot.index for slot in slots].index(index)].of(broken)
    uint64_over = encode(["uint256"] * 9, [1, 5, 6, 2**64, 8, 9, 10, 11, 12])
    with pytest.raises(AbiDecodeError):
        slots[1].of(Answers(1, 2, [*data[:3], uint64_over, *data[4:]]))
    assert batch.add(TOKEN_INFO, TARGET, TARGET).words is None  # strings: eth_abi reads it


def test_aggregate3_call_data_is_eth_abis() -> None:
    """The hand-written ``aggregate3`` call data is eth_abi's, byte for byte, and what
    eth_abi refuses is still refused."""
    checksummed = "0xCA11bde05977b3631167028862bE2a173976CA11"
    calls = [(TARGET, False, BALANCE_OF.encode(TARGET)), (checksummed, True, b""),
             (TARGET, False, b"\x01" * 33), (TARGET.upper().replace("0X", "0x"), True,
                                             USER_STATE.encode(checksummed))]
    bad_checksum = checksummed.replace("CA11b", "cA11b")  # eth_abi takes it
    for batch in ([], calls[:1], calls, [(bad_checksum, False, b"")]):
        assert aggregate3_call_data(batch) == (
            MULTICALL3.functions["aggregate3"].selector
            + encode(["(address,bool,bytes)[]"], [batch]))
    for bad in (("0x1234", False, b""), (TARGET, 1, b""), (TARGET, False, "0x")):
        with pytest.raises(EncodingError):
            aggregate3_call_data([bad])


def test_word_arguments_encode_as_eth_abi_encodes_them() -> None:
    """Calls of words only are written by hand, as eth_abi writes them; what eth_abi refuses
    (a short address, a negative or too large uint, a string for a uint) is still refused."""
    get_child = PHENOMENAL_TREE.functions["getChild"]
    for address, slot in ((TARGET, 0), ("0xCA11bde05977b3631167028862bE2a173976CA11", 2**256 - 1),
                          ("0xcA11bde05977b3631167028862bE2a173976CA11", 1)):  # bad checksum
        assert get_child.encode(address, slot) == get_child.selector + encode(
            ["address", "uint256"], [address, slot])
    for address, slot in ((TARGET, -1), (TARGET, 2**256), ("0x12", 1), (TARGET, "1")):
        with pytest.raises(EncodingError):
            get_child.encode(address, slot)
