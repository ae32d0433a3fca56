// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "./IERC20.sol";
import {PhenomenalTree} from "./PhenomenalTree.sol";
import {Token} from "./Token.sol";

/// @title The FLOW protocol of one dpnm instance: buys and sells FLOW against a USDT pool.
/// @notice Written for flowsvc's tests from the public interface; the economics are in
/// contracts/README.md. All amounts have 18 decimals; basis points are out of 10,000.
contract FlowProtocol {
    uint256 public constant BPS = 10_000;
    uint256 public constant MIN_BUY = 20e18;
    uint256 public constant FEE_BPS = 2_000;
    uint256 public constant TREASURY_BPS = 500;
    /// @notice Each ancestor within LEVELS accrues this share of a descendant's fee as GWT.
    uint256 public constant GWT_FEE_BPS = 1_000;
    uint256 public constant LEVELS = 10;
    uint256 public constant DAILY_FLOOR = 50e18;
    uint256 public constant DAILY_POOL_BPS = 10;
    uint256 public constant DAY = 1 days;
    uint256 public constant SELL_CREDIT_WINDOW = 2 days;
    uint256 public constant TREE_MONTH = 30 days;
    uint256 public constant TREE_MONTH_PRICE = 10e18;
    uint256 public constant TREE_MAX_MONTHS = 3;
    uint256 public constant TREE_MAX_AHEAD = 90 days;
    /// @notice 1 GWT buys 1.25 USDT of income limit.
    uint256 public constant GWT_LIMIT_NUMERATOR = 125;
    uint256 public constant GWT_LIMIT_DENOMINATOR = 100;

    struct User {
        bool activated;
        uint256 incomeLimit;
        uint256 lifetimeLimit;
        uint64 dayStart;
        uint256 boughtToday;
        uint256 refillCredit;
        uint64 refillResetAt;
        uint256 gwtPending;
    }

    IERC20 public immutable usdt;
    Token public immutable flow;
    Token public immutable gwt;
    PhenomenalTree public immutable tree;
    address public immutable treasury;
    uint256 public immutable initialPrice;
    uint256 public poolUSDT;
    mapping(address => User) private users;

    event Activated(address indexed user, address indexed referrer, uint256 depth);
    event Bought(address indexed user, uint256 usdtIn, uint256 flowOut, uint256 priceAfter, uint256 incomeLimitAfter);
    event Sold(
        address indexed user,
        uint256 flowIn,
        uint256 usdtOut,
        uint256 priceAfter,
        uint256 incomeLimitAfter,
        uint256 flowBurned
    );
    event TreeExtended(address indexed user, uint256 months, uint256 activeUntil);
    event IncomeLimitBoughtWithGWT(address indexed user, uint256 gwtBurned, uint256 limitGained);
    event GWTClaimed(address indexed user, uint256 amount);
    event RewardPaid(address indexed payer, address indexed ancestor, uint256 levelIndex, uint256 amount);

    error NotActivated();
    error AlreadyActivated();
    error ReferrerNotActivated();
    error BelowMinimumBuy();
    error DailyLimitExceeded();
    error IncomeLimitExceeded();
    error ZeroAmount();
    error BadMonths();
    error TooFarAhead();
    error NothingToClaim();
    error TransferFailed();

    /// @param root_ the tree's root, activated at deployment with no tree activity.
    /// @param initialPrice_ USDT per FLOW (1e18 scale) while no FLOW exists.
    constructor(address usdt_, address treasury_, address root_, uint256 initialPrice_) {
        usdt = IERC20(usdt_);
        treasury = treasury_;
        initialPrice = initialPrice_;
        flow = new Token("FLOW", "FLOW", address(this));
        gwt = new Token("GWT", "GWT", address(this));
        tree = new PhenomenalTree(root_);
        users[root_].activated = true;
        emit Activated(root_, address(0), 0);
    }

    // ---- writes made by the user's wallet

    /// @notice Places the caller in the tree under `referrer` (an activated user). Activation is
    /// free and gives no tree activity: rewards need `extendTree`.
    function activate(address referrer) external {
        User storage user = users[msg.sender];
        if (user.activated) revert AlreadyActivated();
        if (!users[referrer].activated) revert ReferrerNotActivated();
        (, uint256 depth) = tree.place(msg.sender, referrer);
        user.activated = true;
        emit Activated(msg.sender, referrer, depth);
    }

    function buy(uint256 usdtAmount) external {
        User storage user = _activated(msg.sender);
        if (usdtAmount < MIN_BUY) revert BelowMinimumBuy();
        _spendDailyLimit(user, usdtAmount);
        uint256 price = priceFLOW();
        _pull(msg.sender, address(this), usdtAmount);
        uint256 fee = usdtAmount * FEE_BPS / BPS;
        uint256 flowOut = (usdtAmount - fee) * 1e18 / price;
        uint256 toTreasury = usdtAmount * TREASURY_BPS / BPS;
        uint256 rewarded = _payAncestors(msg.sender, usdtAmount, fee);
        poolUSDT += usdtAmount - toTreasury - rewarded;
        _send(treasury, toTreasury);
        flow.mint(msg.sender, flowOut);
        user.incomeLimit += 2 * usdtAmount;
        user.lifetimeLimit += 2 * usdtAmount;
        emit Bought(msg.sender, usdtAmount, flowOut, priceFLOW(), user.incomeLimit);
    }

    /// @notice Sells at the current price with no fee; reverts when the USDT out exceeds the
    /// caller's income limit. What it pays is re-buyable beyond the daily limit for 48 hours.
    function sell(uint256 flowAmount) external {
        User storage user = _activated(msg.sender);
        if (flowAmount == 0) revert ZeroAmount();
        uint256 usdtOut = flowAmount * priceFLOW() / 1e18;
        if (usdtOut > user.incomeLimit) revert IncomeLimitExceeded();
        flow.burn(msg.sender, flowAmount);
        poolUSDT -= usdtOut;
        user.incomeLimit -= usdtOut;
        if (block.timestamp >= user.refillResetAt) user.refillCredit = 0;
        user.refillCredit += usdtOut;
        user.refillResetAt = uint64(block.timestamp + SELL_CREDIT_WINDOW);
        _send(msg.sender, usdtOut);
        emit Sold(msg.sender, flowAmount, usdtOut, priceFLOW(), user.incomeLimit, flowAmount);
    }

    /// @notice 1 to 3 months of tree activity at 10 USDT per 30 days, paid to the treasury,
    /// counted from the current expiry (or now), never more than 90 days ahead.
    function extendTree(uint256 months) external {
        _activated(msg.sender);
        if (months == 0 || months > TREE_MAX_MONTHS) revert BadMonths();
        uint256 current = tree.activeUntil(msg.sender);
        uint256 until = (current > block.timestamp ? current : block.timestamp) + months * TREE_MONTH;
        if (until > block.timestamp + TREE_MAX_AHEAD) revert TooFarAhead();
        _pull(msg.sender, treasury, months * TREE_MONTH_PRICE);
        tree.setActiveUntil(msg.sender, until);
        emit TreeExtended(msg.sender, months, until);
    }

    function buyIncomeLimitWithGWT(uint256 gwtAmount) external {
        User storage user = _activated(msg.sender);
        if (gwtAmount == 0) revert ZeroAmount();
        gwt.burn(msg.sender, gwtAmount);
        uint256 gained = gwtAmount * GWT_LIMIT_NUMERATOR / GWT_LIMIT_DENOMINATOR;
        user.incomeLimit += gained;
        user.lifetimeLimit += gained;
        emit IncomeLimitBoughtWithGWT(msg.sender, gwtAmount, gained);
    }

    function claimGWT() external {
        User storage user = users[msg.sender];
        uint256 amount = user.gwtPending;
        if (amount == 0) revert NothingToClaim();
        user.gwtPending = 0;
        gwt.mint(msg.sender, amount);
        emit GWTClaimed(msg.sender, amount);
    }

    // ---- views

    function priceFLOW() public view returns (uint256) {
        uint256 supply = flow.totalSupply();
        return supply == 0 ? initialPrice : poolUSDT * 1e18 / supply;
    }

    function dailyLimitMax() public view returns (uint256) {
        uint256 share = poolUSDT * DAILY_POOL_BPS / BPS;
        return share > DAILY_FLOOR ? share : DAILY_FLOOR;
    }

    /// @notice The USDT share of a buy's gross amount paid to the ancestor `level` levels up.
    function levelRewardBps(uint256 level) public pure returns (uint256) {
        if (level == 0) return 500;
        if (level == 1) return 300;
        if (level == 2) return 200;
        if (level < 6) return 100;
        return level < LEVELS ? 50 : 0;
    }

    function incomeLimit(address user) external view returns (uint256) {
        return users[user].incomeLimit;
    }

    function lifetimeIncomeLimit(address user) external view returns (uint256) {
        return users[user].lifetimeLimit;
    }

    function isActivated(address user) external view returns (bool) {
        return users[user].activated;
    }

    function pendingGWT(address user) external view returns (uint256) {
        return users[user].gwtPending;
    }

    /// @notice (activated, incomeLimit, lifetimeLimit, dayStart, boughtToday, refillCredit,
    /// refillResetAt, activeUntil, gwtPending), as stored: `boughtToday` counts only while
    /// now < dayStart + 1 day, and `refillCredit` only while now < refillResetAt (a buy rolls
    /// both over).
    function userState(address account)
        external
        view
        returns (bool, uint256, uint256, uint64, uint256, uint256, uint64, uint256, uint256)
    {
        User storage user = users[account];
        return (
            user.activated,
            user.incomeLimit,
            user.lifetimeLimit,
            user.dayStart,
            user.boughtToday,
            user.refillCredit,
            user.refillResetAt,
            tree.activeUntil(account),
            user.gwtPending
        );
    }

    // ---- internals

    function _activated(address account) private view returns (User storage user) {
        user = users[account];
        if (!user.activated) revert NotActivated();
    }

    /// @dev The daily allowance is spent first, then the sell credit.
    function _spendDailyLimit(User storage user, uint256 amount) private {
        if (block.timestamp >= user.dayStart + DAY) {
            user.dayStart = uint64(block.timestamp);
            user.boughtToday = 0;
        }
        if (block.timestamp >= user.refillResetAt) user.refillCredit = 0;
        uint256 max = dailyLimitMax();
        uint256 allowance = max > user.boughtToday ? max - user.boughtToday : 0;
        uint256 fromDaily = amount < allowance ? amount : allowance;
        uint256 fromCredit = amount - fromDaily;
        if (fromCredit > user.refillCredit) revert DailyLimitExceeded();
        user.boughtToday += fromDaily;
        user.refillCredit -= fromCredit;
    }

    /// @dev Every ancestor within LEVELS accrues GWT; only those with tree activity get USDT.
    function _payAncestors(address payer, uint256 gross, uint256 fee) private returns (uint256 paid) {
        uint256 gwtShare = fee * GWT_FEE_BPS / BPS;
        address ancestor = tree.getParent(payer);
        for (uint256 level = 0; level < LEVELS && ancestor != address(0); ++level) {
            users[ancestor].gwtPending += gwtShare;
            if (tree.isActive(ancestor)) {
                uint256 amount = gross * levelRewardBps(level) / BPS;
                paid += amount;
                _send(ancestor, amount);
                emit RewardPaid(payer, ancestor, level, amount);
            }
            ancestor = tree.getParent(ancestor);
        }
    }

    function _pull(address from, address to, uint256 amount) private {
        if (!usdt.transferFrom(from, to, amount)) revert TransferFailed();
    }

    function _send(address to, uint256 amount) private {
        if (!usdt.transfer(to, amount)) revert TransferFailed();
    }
}
