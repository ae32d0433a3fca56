// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {FlowProtocol} from "./FlowProtocol.sol";

/// @title One launched dpnm token: its FLOW protocol and the parts the protocol deployed.
contract DpnmInstance {
    FlowProtocol public immutable protocol;

    constructor(address usdt, address treasury, address root, uint256 initialPrice) {
        protocol = new FlowProtocol(usdt, treasury, root, initialPrice);
    }

    /// @notice (flow, gwt, tree, protocol)
    function ecosystem() external view returns (address, address, address, address) {
        return (address(protocol.flow()), address(protocol.gwt()), address(protocol.tree()), address(protocol));
    }
}
