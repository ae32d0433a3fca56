// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "./IERC20.sol";
import {Owned} from "./Owned.sol";

/// @title The bonding-curve pair of one launched token and the asset token.
/// @notice reserve0 is the token reserve; reserve1 the asset reserve, virtual liquidity
/// included (the asset actually held is `assetBalance()`). Only its owner, the router that
/// deployed it, moves funds.
contract FPair is Owned {
    address public immutable tokenA;
    address public immutable tokenB;
    uint256 private reserve0;
    uint256 private reserve1;

    event Swap(uint256 amount0In, uint256 amount0Out, uint256 amount1In, uint256 amount1Out);

    error TransferFailed();

    constructor(address token, address asset, uint256 tokenReserve, uint256 assetReserve) {
        tokenA = token;
        tokenB = asset;
        reserve0 = tokenReserve;
        reserve1 = assetReserve;
    }

    function swap(uint256 amount0In, uint256 amount0Out, uint256 amount1In, uint256 amount1Out) external onlyOwner {
        reserve0 = reserve0 + amount0In - amount0Out;
        reserve1 = reserve1 + amount1In - amount1Out;
        emit Swap(amount0In, amount0Out, amount1In, amount1Out);
    }

    function transferTo(address to, uint256 amount) external onlyOwner {
        if (!IERC20(tokenA).transfer(to, amount)) revert TransferFailed();
    }

    function transferAsset(address to, uint256 amount) external onlyOwner {
        if (!IERC20(tokenB).transfer(to, amount)) revert TransferFailed();
    }

    function getReserves() external view returns (uint256, uint256) {
        return (reserve0, reserve1);
    }

    function balance() external view returns (uint256) {
        return IERC20(tokenA).balanceOf(address(this));
    }

    function assetBalance() external view returns (uint256) {
        return IERC20(tokenB).balanceOf(address(this));
    }
}
