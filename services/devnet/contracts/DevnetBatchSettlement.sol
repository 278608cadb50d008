// SPDX-License-Identifier: MIT
// DEVNET STAND-IN. Not for production use.
//
// x402-fleet's own implementation of the x402 batch-settlement contract interface
// (batchSettlementABI, the EIP-712 types and the behaviour described by the batch-settlement EVM
// scheme specification), placed by the devnet at 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003 with
// anvil_setCode. Unidirectional payment channels:
//   - channelId = EIP-712 hash of ChannelConfig under the domain {name: "x402 Batch Settlement",
//     version: "1", chainId, verifyingContract}; created implicitly by the first deposit;
//   - deposit(config, amount, collector, collectorData) pulls funds through a deposit collector
//     (ERC-3009 or Permit2, see DevnetDepositCollectors.sol) and checks that exactly `amount` arrived;
//   - claim / claimWithSignature record cumulative Voucher(bytes32 channelId,uint128
//     maxClaimableAmount) claims of many channels at once (accounting only, no transfer);
//   - settle(receiver, token) sweeps everything claimed but not yet settled in one transfer;
//   - refund / refundWithSignature return unclaimed escrow to the payer (per-channel nonce,
//     incremented before the amount is capped); initiateWithdraw / finalizeWithdraw are the payer's
//     timed escape hatch (withdrawDelay of the channel, 15 minutes to 30 days).
// channels(id).balance is "deposited minus refunded minus withdrawn" (claimed funds stay counted
// until the channel is drained); the unclaimed escrow is balance - totalClaimed.
// No constructor runs at the canonical address: everything is a constant, the EIP-712 domain
// separator is computed from block.chainid and address(this), and the reentrancy lock lives in
// transient storage (zero = unlocked).
pragma solidity ^0.8.28;

interface IERC20Minimal {
    function balanceOf(address account) external view returns (uint256);
    function transfer(address to, uint256 value) external returns (bool);
}

interface IERC1271 {
    function isValidSignature(bytes32 hash, bytes memory signature) external view returns (bytes4 magicValue);
}

/// Implemented by the deposit collectors: move `amount` of `token` from `payer` to the batch
/// settlement contract, authorised by the payer's signature in `collectorData` bound to `channelId`.
interface IDevnetDepositCollector {
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external;
}

/// Shared helpers of the batch-settlement contracts (abstract: no bytecode of its own).
abstract contract DevnetEscrowBase {
    error ReentrancyGuardReentrantCall();
    error TokenTransferFailed(address token, address to, uint256 amount);

    bytes4 private constant ERC1271_MAGIC_VALUE = 0x1626ba7e;
    /// secp256k1 order / 2: signatures with a larger s are malleable and rejected.
    uint256 private constant HALF_CURVE_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;

    bool private transient _entered;

    modifier nonReentrant() {
        if (_entered) revert ReentrancyGuardReentrantCall();
        _entered = true;
        _;
        _entered = false;
    }

    /// ERC-20 transfer that accepts tokens returning nothing and fails on `false` or a revert.
    function _safeTransfer(address token, address to, uint256 amount) internal {
        (bool ok, bytes memory ret) = token.call(abi.encodeCall(IERC20Minimal.transfer, (to, amount)));
        if (!ok || (ret.length == 0 && token.code.length == 0) || (ret.length != 0 && !abi.decode(ret, (bool)))) {
            revert TokenTransferFailed(token, to, amount);
        }
    }

    /// Plain ECDSA (65-byte r,s,v; low s; v 27/28); address(0) when the signature is unusable.
    function _recover(bytes32 digest, bytes calldata signature) internal pure returns (address) {
        if (signature.length != 65) return address(0);
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > HALF_CURVE_ORDER) return address(0);
        if (v != 27 && v != 28) return address(0);
        return ecrecover(digest, v, r, s);
    }

    /// ECDSA for accounts without code, ERC-1271 for accounts with code (SignatureChecker semantics).
    function _isValidSignatureNow(address signer, bytes32 digest, bytes calldata signature) internal view returns (bool) {
        if (signer.code.length > 0) {
            (bool ok, bytes memory ret) = signer.staticcall(abi.encodeCall(IERC1271.isValidSignature, (digest, signature)));
            return ok && ret.length >= 32 && abi.decode(ret, (bytes32)) == bytes32(ERC1271_MAGIC_VALUE);
        }
        address recovered = _recover(digest, signature);
        return recovered != address(0) && recovered == signer;
    }
}

contract DevnetBatchSettlement is DevnetEscrowBase {
    struct ChannelConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }

    struct Voucher {
        ChannelConfig channel;
        uint128 maxClaimableAmount;
    }

    struct VoucherClaim {
        Voucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }

    struct ChannelState {
        uint128 balance;
        uint128 totalClaimed;
    }

    struct PendingWithdrawal {
        uint128 amount;
        uint40 initiatedAt;
    }

    struct ReceiverState {
        uint128 totalClaimed;
        uint128 totalSettled;
    }

    event ChannelCreated(bytes32 indexed channelId, ChannelConfig config);
    event ChannelClosed(bytes32 indexed channelId, ChannelConfig config);
    event Deposited(bytes32 indexed channelId, address indexed payer, address indexed collector, uint128 amount, uint128 balance);
    event Claimed(bytes32 indexed channelId, address indexed receiver, address indexed token, uint128 amount, uint128 totalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed payer, uint128 amount, uint256 nonce);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint256 finalizableAt);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed payer, uint128 amount);

    error ZeroAmount();
    error AmountOverflow();
    error InvalidPayer();
    error InvalidReceiver();
    error InvalidReceiverAuthorizer();
    error InvalidToken();
    error InvalidWithdrawDelay(uint40 withdrawDelay);
    error InvalidCollector(address collector);
    error DepositAmountMismatch(uint256 expected, uint256 received);
    error EmptyClaims();
    error Unauthorized(address caller);
    error ReceiverAuthorizerMismatch(bytes32 channelId);
    error InvalidAuthorizerSignature();
    error InvalidVoucherSignature(bytes32 channelId);
    error ClaimExceedsVoucher(bytes32 channelId, uint128 totalClaimed, uint128 maxClaimableAmount);
    error ClaimExceedsBalance(bytes32 channelId, uint128 totalClaimed, uint128 balance);
    error InvalidRefundNonce(uint256 expected, uint256 provided);
    error WithdrawalAlreadyPending(bytes32 channelId);
    error NoPendingWithdrawal(bytes32 channelId);
    error WithdrawDelayNotElapsed(uint256 finalizableAt);
    error WithdrawExceedsAvailable(uint128 amount, uint128 available);

    string public constant NAME = "x402 Batch Settlement";
    string public constant VERSION = "1";
    uint40 public constant MIN_WITHDRAW_DELAY = 900; // 15 minutes
    uint40 public constant MAX_WITHDRAW_DELAY = 2_592_000; // 30 days

    bytes32 private constant EIP712_DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 public constant CHANNEL_CONFIG_TYPEHASH = keccak256(
        "ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)"
    );
    bytes32 public constant VOUCHER_TYPEHASH = keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)");
    bytes32 public constant REFUND_TYPEHASH = keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)");
    bytes32 public constant CLAIM_ENTRY_TYPEHASH =
        keccak256("ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)");
    bytes32 public constant CLAIM_BATCH_TYPEHASH = keccak256(
        "ClaimBatch(ClaimEntry[] claims)ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)"
    );

    mapping(bytes32 channelId => ChannelState) public channels;
    mapping(bytes32 channelId => PendingWithdrawal) public pendingWithdrawals;
    mapping(address receiver => mapping(address token => ReceiverState)) public receivers;
    mapping(bytes32 channelId => uint256) public refundNonce;

    // ---------------------------------------------------------------- batching

    /// Runs several calls of this contract in one transaction (all or nothing); reverts bubble up.
    function multicall(bytes[] calldata data) external returns (bytes[] memory results) {
        results = new bytes[](data.length);
        for (uint256 i = 0; i < data.length; ++i) {
            (bool ok, bytes memory ret) = address(this).delegatecall(data[i]);
            if (!ok) {
                assembly ("memory-safe") {
                    revert(add(ret, 0x20), mload(ret))
                }
            }
            results[i] = ret;
        }
    }

    // ---------------------------------------------------------------- deposits

    /// Pulls `amount` from config.payer through `collector` into the channel (created on first use).
    /// Permissionless: the payer's authorisation travels in `collectorData`, bound to the channel id.
    function deposit(ChannelConfig calldata config, uint128 amount, address collector, bytes calldata collectorData)
        external
        nonReentrant
    {
        if (amount == 0) revert ZeroAmount();
        _validateConfig(config);
        if (collector.code.length == 0) revert InvalidCollector(collector);
        bytes32 channelId = getChannelId(config);
        ChannelState storage ch = channels[channelId];
        bool created = ch.balance == 0 && ch.totalClaimed == 0;

        uint256 before = IERC20Minimal(config.token).balanceOf(address(this));
        IDevnetDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        uint256 received = IERC20Minimal(config.token).balanceOf(address(this)) - before;
        if (received != amount) revert DepositAmountMismatch(amount, received);

        uint256 newBalance = uint256(ch.balance) + amount;
        if (newBalance > type(uint128).max) revert AmountOverflow();
        ch.balance = uint128(newBalance);
        if (created) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, config.payer, collector, amount, uint128(newBalance));
    }

    function _validateConfig(ChannelConfig calldata config) private view {
        if (config.payer == address(0)) revert InvalidPayer();
        if (config.receiver == address(0)) revert InvalidReceiver();
        if (config.receiverAuthorizer == address(0)) revert InvalidReceiverAuthorizer();
        if (config.token.code.length == 0) revert InvalidToken();
        if (config.withdrawDelay < MIN_WITHDRAW_DELAY || config.withdrawDelay > MAX_WITHDRAW_DELAY) {
            revert InvalidWithdrawDelay(config.withdrawDelay);
        }
    }

    // ---------------------------------------------------------------- claims

    /// Records voucher claims; the caller must be the receiver or the receiver authorizer of every row.
    function claim(VoucherClaim[] calldata voucherClaims) external nonReentrant {
        if (voucherClaims.length == 0) revert EmptyClaims();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            ChannelConfig calldata c = voucherClaims[i].voucher.channel;
            if (msg.sender != c.receiver && msg.sender != c.receiverAuthorizer) revert Unauthorized(msg.sender);
            _processClaim(getChannelId(c), voucherClaims[i]);
        }
    }

    /// Records voucher claims of many channels authorised by one EIP-712 ClaimBatch signature of the
    /// rows' common receiverAuthorizer. Anyone may relay it.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        nonReentrant
    {
        if (voucherClaims.length == 0) revert EmptyClaims();
        (bytes32 digest, bytes32[] memory ids) = _claimBatch(voucherClaims);
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        for (uint256 i = 1; i < voucherClaims.length; ++i) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert ReceiverAuthorizerMismatch(ids[i]);
        }
        if (!_isValidSignatureNow(authorizer, digest, authorizerSignature)) revert InvalidAuthorizerSignature();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            _processClaim(ids[i], voucherClaims[i]);
        }
    }

    /// Raises the channel's totalClaimed to claim.totalClaimed (<= the voucher's ceiling and the
    /// balance). A row at or below what is already claimed is a no-op, so a retried batch succeeds.
    function _processClaim(bytes32 channelId, VoucherClaim calldata c) private {
        uint128 newTotal = c.totalClaimed;
        uint128 ceiling = c.voucher.maxClaimableAmount;
        if (newTotal > ceiling) revert ClaimExceedsVoucher(channelId, newTotal, ceiling);
        ChannelState storage ch = channels[channelId];
        uint128 previous = ch.totalClaimed;
        if (newTotal <= previous) return;
        if (newTotal > ch.balance) revert ClaimExceedsBalance(channelId, newTotal, ch.balance);
        if (!_isValidVoucher(c.voucher.channel, channelId, ceiling, c.signature)) revert InvalidVoucherSignature(channelId);
        uint128 delta = newTotal - previous;
        ch.totalClaimed = newTotal;
        address receiver = c.voucher.channel.receiver;
        address token = c.voucher.channel.token;
        receivers[receiver][token].totalClaimed += delta;
        emit Claimed(channelId, receiver, token, delta, newTotal);
    }

    /// ECDSA against payerAuthorizer when set (no code check, no ERC-1271); otherwise
    /// SignatureChecker semantics against the payer (ECDSA for EOAs, ERC-1271 for contracts).
    function _isValidVoucher(ChannelConfig calldata config, bytes32 channelId, uint128 ceiling, bytes calldata signature)
        private
        view
        returns (bool)
    {
        bytes32 digest = getVoucherDigest(channelId, ceiling);
        if (config.payerAuthorizer != address(0)) {
            address recovered = _recover(digest, signature);
            return recovered != address(0) && recovered == config.payerAuthorizer;
        }
        return _isValidSignatureNow(config.payer, digest, signature);
    }

    // ---------------------------------------------------------------- settlement

    /// Transfers everything claimed but not yet settled for (receiver, token) to the receiver.
    /// Permissionless; a no-op (no transfer, no event) when there is nothing to settle.
    function settle(address receiver, address token) external nonReentrant {
        ReceiverState storage r = receivers[receiver][token];
        uint128 amount = r.totalClaimed - r.totalSettled;
        if (amount == 0) return;
        r.totalSettled = r.totalClaimed;
        _safeTransfer(token, receiver, amount);
        emit Settled(receiver, token, msg.sender, amount);
    }

    // ---------------------------------------------------------------- refunds

    /// Cooperative refund by the receiver or the receiver authorizer, no signature needed.
    function refund(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) revert Unauthorized(msg.sender);
        _refund(config, getChannelId(config), amount);
    }

    /// Cooperative refund relayed by anyone with the receiver authorizer's EIP-712
    /// Refund(bytes32 channelId,uint256 nonce,uint128 amount) signature for the current nonce.
    function refundWithSignature(
        ChannelConfig calldata config,
        uint128 amount,
        uint256 nonce,
        bytes calldata receiverAuthorizerSignature
    ) external nonReentrant {
        bytes32 channelId = getChannelId(config);
        uint256 expected = refundNonce[channelId];
        if (nonce != expected) revert InvalidRefundNonce(expected, nonce);
        bytes32 digest = getRefundDigest(channelId, nonce, amount);
        if (!_isValidSignatureNow(config.receiverAuthorizer, digest, receiverAuthorizerSignature)) {
            revert InvalidAuthorizerSignature();
        }
        _refund(config, channelId, amount);
    }

    /// Advances the refund nonce first, then returns min(amount, unclaimed escrow) to the payer. A
    /// pending withdrawal shrinks by the refunded amount (and is cancelled once fully covered).
    function _refund(ChannelConfig calldata config, bytes32 channelId, uint128 amount) private {
        if (amount == 0) revert ZeroAmount();
        uint256 nonce = refundNonce[channelId]++;
        ChannelState storage ch = channels[channelId];
        uint128 available = ch.balance - ch.totalClaimed;
        uint128 actual = amount < available ? amount : available;
        if (actual == 0) return;
        ch.balance -= actual;
        PendingWithdrawal storage pw = pendingWithdrawals[channelId];
        if (pw.initiatedAt != 0) {
            if (actual >= pw.amount) delete pendingWithdrawals[channelId];
            else pw.amount -= actual;
        }
        _safeTransfer(config.token, config.payer, actual);
        emit Refunded(channelId, config.payer, actual, nonce);
        _emitClosedIfDrained(channelId, config, ch);
    }

    // ---------------------------------------------------------------- timed withdrawal

    /// Starts the payer's timed withdrawal of up to the current unclaimed escrow.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        _onlyPayerSide(config);
        if (amount == 0) revert ZeroAmount();
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal storage pw = pendingWithdrawals[channelId];
        if (pw.initiatedAt != 0) revert WithdrawalAlreadyPending(channelId);
        ChannelState storage ch = channels[channelId];
        uint128 available = ch.balance - ch.totalClaimed;
        if (amount > available) revert WithdrawExceedsAvailable(amount, available);
        pw.amount = amount;
        pw.initiatedAt = uint40(block.timestamp);
        emit WithdrawInitiated(channelId, amount, block.timestamp + config.withdrawDelay);
    }

    /// Completes a pending withdrawal once withdrawDelay has elapsed, capped to the unclaimed escrow
    /// left at that point (the receiver may have claimed in the meantime).
    function finalizeWithdraw(ChannelConfig calldata config) external nonReentrant {
        _onlyPayerSide(config);
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal memory pw = pendingWithdrawals[channelId];
        if (pw.initiatedAt == 0) revert NoPendingWithdrawal(channelId);
        uint256 finalizableAt = uint256(pw.initiatedAt) + config.withdrawDelay;
        if (block.timestamp < finalizableAt) revert WithdrawDelayNotElapsed(finalizableAt);
        delete pendingWithdrawals[channelId];
        ChannelState storage ch = channels[channelId];
        uint128 available = ch.balance - ch.totalClaimed;
        uint128 amount = pw.amount < available ? pw.amount : available;
        if (amount > 0) {
            ch.balance -= amount;
            _safeTransfer(config.token, config.payer, amount);
        }
        emit WithdrawFinalized(channelId, config.payer, amount);
        if (amount > 0) _emitClosedIfDrained(channelId, config, ch);
    }

    function _onlyPayerSide(ChannelConfig calldata config) private view {
        if (msg.sender == config.payer) return;
        if (config.payerAuthorizer != address(0) && msg.sender == config.payerAuthorizer) return;
        revert Unauthorized(msg.sender);
    }

    function _emitClosedIfDrained(bytes32 channelId, ChannelConfig calldata config, ChannelState storage ch) private {
        if (ch.balance == 0 && ch.totalClaimed == 0) emit ChannelClosed(channelId, config);
    }

    // ---------------------------------------------------------------- EIP-712 views

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(EIP712_DOMAIN_TYPEHASH, keccak256(bytes(NAME)), keccak256(bytes(VERSION)), block.chainid, address(this))
        );
    }

    /// EIP-5267: fields 0x0f = name, version, chainId, verifyingContract.
    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory name,
            string memory version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", NAME, VERSION, block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    function getChannelId(ChannelConfig calldata config) public view returns (bytes32) {
        return _hashTypedData(
            keccak256(
                abi.encode(
                    CHANNEL_CONFIG_TYPEHASH,
                    config.payer,
                    config.payerAuthorizer,
                    config.receiver,
                    config.receiverAuthorizer,
                    config.token,
                    config.withdrawDelay,
                    config.salt
                )
            )
        );
    }

    function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) public view returns (bytes32) {
        return _hashTypedData(keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, maxClaimableAmount)));
    }

    function getRefundDigest(bytes32 channelId, uint256 nonce, uint128 amount) public view returns (bytes32) {
        return _hashTypedData(keccak256(abi.encode(REFUND_TYPEHASH, channelId, nonce, amount)));
    }

    function getClaimBatchDigest(VoucherClaim[] calldata voucherClaims) external view returns (bytes32 digest) {
        (digest,) = _claimBatch(voucherClaims);
    }

    /// ClaimBatch(ClaimEntry[] claims) digest and the channel id of every row.
    function _claimBatch(VoucherClaim[] calldata voucherClaims) private view returns (bytes32, bytes32[] memory ids) {
        ids = new bytes32[](voucherClaims.length);
        bytes32[] memory entries = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            ids[i] = getChannelId(voucherClaims[i].voucher.channel);
            entries[i] = keccak256(
                abi.encode(
                    CLAIM_ENTRY_TYPEHASH, ids[i], voucherClaims[i].voucher.maxClaimableAmount, voucherClaims[i].totalClaimed
                )
            );
        }
        return (_hashTypedData(keccak256(abi.encode(CLAIM_BATCH_TYPEHASH, keccak256(abi.encodePacked(entries))))), ids);
    }

    function _hashTypedData(bytes32 structHash) private view returns (bytes32) {
        return keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), structHash));
    }
}
