// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Owned} from "./Owned.sol";

/// @title The placement tree of a FLOW protocol: three direct slots per node.
/// @notice The protocol that deploys it is its only writer. A new user goes under its
/// referrer when the referrer has a free slot, else under the first node with a free slot in
/// a breadth-first walk of the referrer's subtree (children in slot order). Every ancestor's
/// subtree size grows by one. The root is placed at deployment with depth 0.
contract PhenomenalTree is Owned {
    uint256 public constant SLOTS = 3;

    struct Node {
        bool placed;
        address parent;
        uint256 depth;
        uint256 subtreeSize;
        uint256 activeUntil;
        uint256 childCount;
        address[3] children;
    }

    address public immutable root;
    mapping(address => Node) private nodes;

    event UserPlaced(address indexed user, address indexed referrer, address indexed parent, uint256 depth);
    event ActiveUntilSet(address indexed user, uint256 activeUntil);

    error AlreadyPlaced();
    error UnknownReferrer();
    error NoSuchSlot();

    constructor(address root_) {
        root = root_;
        nodes[root_].placed = true;
        emit UserPlaced(root_, address(0), address(0), 0);
    }

    function place(address user, address referrer) external onlyOwner returns (address parent, uint256 depth) {
        if (nodes[user].placed) revert AlreadyPlaced();
        if (!nodes[referrer].placed) revert UnknownReferrer();
        parent = _firstFreeSlot(referrer);
        Node storage above = nodes[parent];
        above.children[above.childCount] = user;
        above.childCount += 1;
        depth = above.depth + 1;
        Node storage node = nodes[user];
        node.placed = true;
        node.parent = parent;
        node.depth = depth;
        for (address ancestor = parent; ancestor != address(0); ancestor = nodes[ancestor].parent) {
            nodes[ancestor].subtreeSize += 1;
        }
        emit UserPlaced(user, referrer, parent, depth);
    }

    function setActiveUntil(address user, uint256 activeUntil_) external onlyOwner {
        nodes[user].activeUntil = activeUntil_;
        emit ActiveUntilSet(user, activeUntil_);
    }

    function isPlaced(address user) external view returns (bool) {
        return nodes[user].placed;
    }

    function getParent(address user) external view returns (address) {
        return nodes[user].parent;
    }

    /// @notice The user in direct slot `i` (0, 1 or 2), or 0 for a free slot.
    function getChild(address user, uint256 i) external view returns (address) {
        if (i >= SLOTS) revert NoSuchSlot();
        return nodes[user].children[i];
    }

    /// @notice The number of descendants, the user excluded.
    function getSubtreeSize(address user) external view returns (uint256) {
        return nodes[user].subtreeSize;
    }

    function getDepth(address user) external view returns (uint256) {
        return nodes[user].depth;
    }

    function activeUntil(address user) external view returns (uint256) {
        return nodes[user].activeUntil;
    }

    function isActive(address user) external view returns (bool) {
        return nodes[user].activeUntil > block.timestamp;
    }

    /// @dev Every node of the subtree enters the queue at most once, so subtreeSize + 1 slots
    /// suffice; the walk always ends, since the subtree's deepest nodes have free slots.
    function _firstFreeSlot(address start) private view returns (address free) {
        address[] memory queue = new address[](nodes[start].subtreeSize + 1);
        queue[0] = start;
        uint256 tail = 1;
        for (uint256 head = 0; free == address(0); ++head) {
            Node storage node = nodes[queue[head]];
            if (node.childCount < SLOTS) {
                free = queue[head];
            } else {
                for (uint256 i = 0; i < SLOTS; ++i) queue[tail++] = node.children[i];
            }
        }
    }
}
