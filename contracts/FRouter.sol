// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {FPair} from "./FPair.sol";
import {IERC20} from "./IERC20.sol";
import {Owned} from "./Owned.sol";

/// @title Creates bonding pairs and trades on them for its Bonding (constant product, no fee).
/// @notice Traders approve the router, which pulls what they pay; only its owner, the Bonding
/// that deployed it, may trade, on the trader's behalf.
contract FRouter is Owned {
    address public immutable assetToken;
    mapping(address => address) public getPair;

    error ZeroAmount();
    error TransferFailed();

    constructor(address asset) {
        assetToken = asset;
    }

    function createPair(address token, uint256 tokenReserve, uint256 assetReserve)
        external
        onlyOwner
        returns (address pair)
    {
        pair = address(new FPair(token, assetToken, tokenReserve, assetReserve));
        getPair[token] = pair;
    }

    /// @notice The amount out for `amountIn` of `tokenIn`: tokens for the asset (a buy), or
    /// the asset for `token` (a sell).
    function getAmountsOut(address token, address tokenIn, uint256 amountIn) public view returns (uint256) {
        (uint256 tokenReserve, uint256 assetReserve) = FPair(getPair[token]).getReserves();
        return tokenIn == assetToken
            ? amountIn * tokenReserve / (assetReserve + amountIn)
            : amountIn * assetReserve / (tokenReserve + amountIn);
    }

    function buy(uint256 amountIn, address token, address to) external onlyOwner returns (uint256 amountOut) {
        if (amountIn == 0) revert ZeroAmount();
        FPair pair = FPair(getPair[token]);
        amountOut = getAmountsOut(token, assetToken, amountIn);
        if (!IERC20(assetToken).transferFrom(to, address(pair), amountIn)) revert TransferFailed();
        pair.swap(0, amountOut, amountIn, 0);
        pair.transferTo(to, amountOut);
    }

    function sell(uint256 amountIn, address token, address to) external onlyOwner returns (uint256 amountOut) {
        if (amountIn == 0) revert ZeroAmount();
        FPair pair = FPair(getPair[token]);
        amountOut = getAmountsOut(token, token, amountIn);
        if (!IERC20(token).transferFrom(to, address(pair), amountIn)) revert TransferFailed();
        pair.swap(amountIn, 0, 0, amountOut);
        pair.transferAsset(to, amountOut);
    }
}
