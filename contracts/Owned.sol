// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice Its deployer is its owner, the only caller allowed where `onlyOwner` stands: the
/// protocol for its tree, the Bonding for its router, the router for its pairs.
abstract contract Owned {
    address public immutable owner;

    error NotOwner();

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner();
        _;
    }

    constructor() {
        owner = msg.sender;
    }
}
