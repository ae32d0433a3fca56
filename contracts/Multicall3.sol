// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title An aggregate3-compatible Multicall3 (same ABI, selector 0x82ad56cb), written for
/// flowsvc's tests and placed at 0xcA11bde05977b3631167028862bE2a173976CA11 with anvil_setCode.
contract Multicall3 {
    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    /// @notice Calls each target in order; a failed call whose allowFailure is false reverts
    /// the whole batch with "Multicall3: call failed", like the canonical deployment.
    function aggregate3(Call3[] calldata calls) external payable returns (Result[] memory returnData) {
        returnData = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; ++i) {
            (bool success, bytes memory data) = calls[i].target.call(calls[i].callData);
            require(success || calls[i].allowFailure, "Multicall3: call failed");
            returnData[i] = Result(success, data);
        }
    }

    function getBlockNumber() external view returns (uint256) {
        return block.number;
    }

    function getCurrentBlockTimestamp() external view returns (uint256) {
        return block.timestamp;
    }
}
