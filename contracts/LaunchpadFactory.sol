// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Bonding} from "./Bonding.sol";
import {DpnmInstance} from "./DpnmInstance.sol";

/// @title Launches tokens by template id and announces each with `Launched`.
/// @notice keccak256("dpnm"): params = abi.encode(address usdt, address treasury, address root,
/// uint256 initialPrice); deploys a DpnmInstance with CREATE2 under `salt`.
/// keccak256("virtuals"): params = abi.encode(address bonding, string name, string ticker);
/// launches a bonding-curve token through that Bonding (the caller is its creator; `salt` is
/// only echoed). Any other id (such as "dpnm-v2") reverts with UnknownTemplate.
contract LaunchpadFactory {
    bytes32 public constant DPNM = keccak256("dpnm");
    bytes32 public constant VIRTUALS = keccak256("virtuals");

    event Launched(bytes32 indexed id, address indexed instance, address indexed deployer, bytes32 salt, bytes params);

    error UnknownTemplate(bytes32 id);

    function launch(bytes32 id, bytes calldata params, bytes32 salt) external returns (address instance) {
        if (id == DPNM) {
            (address usdt, address treasury, address root, uint256 initialPrice) =
                abi.decode(params, (address, address, address, uint256));
            instance = address(new DpnmInstance{salt: salt}(usdt, treasury, root, initialPrice));
        } else if (id == VIRTUALS) {
            (address bonding, string memory name, string memory ticker) = abi.decode(params, (address, string, string));
            instance = Bonding(bonding).launch(msg.sender, name, ticker);
        } else {
            revert UnknownTemplate(id);
        }
        emit Launched(id, instance, msg.sender, salt, params);
    }
}
