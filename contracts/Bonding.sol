// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {FRouter} from "./FRouter.sol";
import {FPair} from "./FPair.sol";
import {Token} from "./Token.sol";

/// @title A Virtuals-style bonding-curve launcher: tokens trade against an asset on an FPair
/// until the token reserve falls to `gradThreshold`, then graduate.
/// @notice `tokenInfo`'s price fields (price, marketCap, liquidity, volume, volume24H,
/// prevPrice) are set at launch and never updated: trades only touch `lastUpdated`, mirroring
/// the public protocol since May 2025. Live price and market cap come from the pair's reserves.
/// Graduation stops trading here and deploys the agent token; the liquidity stays in the pair.
contract Bonding {
    struct Data {
        address token;
        string name;
        string _name;
        string ticker;
        uint256 supply;
        uint256 price;
        uint256 marketCap;
        uint256 liquidity;
        uint256 volume;
        uint256 volume24H;
        uint256 prevPrice;
        uint256 lastUpdated;
    }

    struct TokenInfo {
        address creator;
        address token;
        address pair;
        address agentToken;
        Data data;
        string description;
        string image;
        string twitter;
        string telegram;
        string youtube;
        string website;
        bool trading;
        bool tradingOnUniswap;
    }

    FRouter public immutable router;
    address public immutable assetToken;
    uint256 public immutable initialSupply;
    /// @notice Asset reserve a pair starts with, none of it deposited.
    uint256 public immutable virtualLiquidity;
    uint256 public immutable gradThreshold;
    mapping(address => TokenInfo) public tokenInfo;
    address[] public tokens;

    event Launched(address indexed token, address indexed pair, uint256);
    event Graduated(address indexed token, address agentToken);

    error NotTrading();

    constructor(address asset, uint256 initialSupply_, uint256 virtualLiquidity_, uint256 gradThreshold_) {
        router = new FRouter(asset);
        assetToken = asset;
        initialSupply = initialSupply_;
        virtualLiquidity = virtualLiquidity_;
        gradThreshold = gradThreshold_;
    }

    /// @notice Launches a token for `creator`; the third field of `Launched` is its index.
    function launch(address creator, string calldata name, string calldata ticker) external returns (address) {
        Token token = new Token(name, ticker, address(this));
        address pair = router.createPair(address(token), initialSupply, virtualLiquidity);
        token.mint(pair, initialSupply);
        uint256 price = virtualLiquidity * 1e18 / initialSupply;
        TokenInfo storage info = tokenInfo[address(token)];
        info.creator = creator;
        info.token = address(token);
        info.pair = pair;
        info.data = Data({
            token: address(token),
            name: name,
            _name: name,
            ticker: ticker,
            supply: initialSupply,
            price: price,
            marketCap: price * initialSupply / 1e18,
            liquidity: virtualLiquidity,
            volume: 0,
            volume24H: 0,
            prevPrice: price,
            lastUpdated: block.timestamp
        });
        info.trading = true;
        tokens.push(address(token));
        emit Launched(address(token), pair, tokens.length - 1);
        return address(token);
    }

    /// @notice Pays `amountIn` of the asset (approved to the router) for tokens.
    function buy(uint256 amountIn, address token) external returns (uint256 amountOut) {
        TokenInfo storage info = _trading(token);
        amountOut = router.buy(amountIn, token, msg.sender);
        info.data.lastUpdated = block.timestamp;
        (uint256 tokenReserve,) = FPair(info.pair).getReserves();
        if (tokenReserve <= gradThreshold) _graduate(info);
    }

    /// @notice Sells `amountIn` tokens (approved to the router) for the asset.
    function sell(uint256 amountIn, address token) external returns (uint256 amountOut) {
        TokenInfo storage info = _trading(token);
        amountOut = router.sell(amountIn, token, msg.sender);
        info.data.lastUpdated = block.timestamp;
    }

    function _trading(address token) private view returns (TokenInfo storage info) {
        info = tokenInfo[token];
        if (!info.trading) revert NotTrading();
    }

    function _graduate(TokenInfo storage info) private {
        Token agentToken = new Token(info.data.name, info.data.ticker, address(this));
        info.agentToken = address(agentToken);
        info.trading = false;
        info.tradingOnUniswap = true;
        emit Graduated(info.token, address(agentToken));
    }
}
