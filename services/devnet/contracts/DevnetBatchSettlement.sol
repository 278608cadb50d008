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
// Seen from outside it behaves as the deployed x402BatchSettlement: the same events, the same
// custom errors (names and arguments, so the same selectors), checked in the same order, and the
// same getters; only the code is ours.
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
    // OpenZeppelin's errors, as the deployed contracts raise them (ReentrancyGuardTransient, SafeERC20, ECDSA).
    error ReentrancyGuardReentrantCall();
    error SafeERC20FailedOperation(address token);
    error ECDSAInvalidSignature();
    error ECDSAInvalidSignatureLength(uint256 length);
    error ECDSAInvalidSignatureS(bytes32 s);

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
            revert SafeERC20FailedOperation(token);
        }
    }

    /// ECDSA that reverts on an unusable signature (OpenZeppelin's ECDSA.recover semantics).
    function _recoverOrRevert(bytes32 digest, bytes calldata signature) internal pure returns (address) {
        if (signature.length != 65) revert ECDSAInvalidSignatureLength(signature.length);
        bytes32 s = bytes32(signature[32:64]);
        if (uint256(s) > HALF_CURVE_ORDER) revert ECDSAInvalidSignatureS(s);
        address recovered = _recover(digest, signature);
        if (recovered == address(0)) revert ECDSAInvalidSignature();
        return recovered;
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
    event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance);
    event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount);

    error InvalidChannel();
    error ZeroDeposit();
    error DepositOverflow();
    error InvalidSignature();
    error NotReceiverAuthorizer();
    error NotAuthorizedToClaim();
    error NotAuthorizedToRefund();
    error ClaimExceedsCeiling();
    error ClaimExceedsBalance();
    error WithdrawalAlreadyPending();
    error WithdrawalNotPending();
    error NotAuthorizedToFinalizeWithdraw();
    error WithdrawDelayNotElapsed();
    error NothingToWithdraw();
    error WithdrawAmountExceedsAvailable();
    error WithdrawDelayOutOfRange();
    error EmptyBatch();
    error DepositCollectionFailed();
    error InvalidCollector();
    error InvalidRefundNonce();
    error ZeroRefund();

    string private constant NAME = "x402 Batch Settlement";
    string private constant VERSION = "1";
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
        if (config.payer == address(0) || config.receiver == address(0) || config.receiverAuthorizer == address(0) || config.token == address(0)) {
            revert InvalidChannel();
        }
        if (config.withdrawDelay < MIN_WITHDRAW_DELAY || config.withdrawDelay > MAX_WITHDRAW_DELAY) revert WithdrawDelayOutOfRange();
        if (amount == 0) revert ZeroDeposit();
        if (collector == address(0)) revert InvalidCollector();
        bytes32 channelId = getChannelId(config);
        ChannelState storage ch = channels[channelId];
        if (amount > type(uint128).max - ch.balance) revert DepositOverflow();
        ch.balance += amount;

        uint256 before = IERC20Minimal(config.token).balanceOf(address(this));
        IDevnetDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        if (IERC20Minimal(config.token).balanceOf(address(this)) != before + amount) revert DepositCollectionFailed();

        // The escrow was empty before this deposit and nothing was ever claimed: a new channel.
        if (ch.balance == amount && ch.totalClaimed == 0) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, msg.sender, amount, ch.balance);
    }

    // ---------------------------------------------------------------- claims

    /// Records voucher claims; the caller must be the receiver or the receiver authorizer of every row.
    function claim(VoucherClaim[] calldata voucherClaims) external nonReentrant {
        if (voucherClaims.length == 0) revert EmptyBatch();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            if (!_isReceiverSide(msg.sender, voucherClaims[i].voucher.channel)) revert NotAuthorizedToClaim();
            _processClaim(getChannelId(voucherClaims[i].voucher.channel), voucherClaims[i]);
        }
    }

    /// Records voucher claims of many channels authorised by one EIP-712 ClaimBatch signature of the
    /// first row's receiverAuthorizer (every row must share it). Anyone may relay it.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        nonReentrant
    {
        if (voucherClaims.length == 0) revert EmptyBatch();
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        (bytes32 digest, bytes32[] memory ids) = _claimBatch(voucherClaims);
        if (!_isValidSignatureNow(authorizer, digest, authorizerSignature)) revert InvalidSignature();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert NotReceiverAuthorizer();
            _processClaim(ids[i], voucherClaims[i]);
        }
    }

    function _isReceiverSide(address sender, ChannelConfig calldata config) private pure returns (bool) {
        return sender == config.receiverAuthorizer || sender == config.receiver;
    }

    /// Raises the channel's totalClaimed to claim.totalClaimed. A row at or below what is already
    /// claimed is a no-op (checked first, so a retried batch succeeds); above the voucher's ceiling
    /// or the balance it reverts; then the voucher's signature is checked.
    function _processClaim(bytes32 channelId, VoucherClaim calldata c) private {
        ChannelState storage ch = channels[channelId];
        uint128 newTotal = c.totalClaimed;
        if (newTotal <= ch.totalClaimed) return;
        if (newTotal > c.voucher.maxClaimableAmount) revert ClaimExceedsCeiling();
        if (newTotal > ch.balance) revert ClaimExceedsBalance();
        if (!_isValidVoucher(c.voucher.channel, channelId, c.voucher.maxClaimableAmount, c.signature)) revert InvalidSignature();
        uint128 delta = newTotal - ch.totalClaimed;
        ch.totalClaimed = newTotal;
        receivers[c.voucher.channel.receiver][c.voucher.channel.token].totalClaimed += delta;
        emit Claimed(channelId, msg.sender, delta, newTotal);
    }

    /// ECDSA against payerAuthorizer when set (no ERC-1271; an unusable signature reverts with
    /// OpenZeppelin's ECDSA errors); otherwise SignatureChecker semantics against the payer.
    function _isValidVoucher(ChannelConfig calldata config, bytes32 channelId, uint128 ceiling, bytes calldata signature)
        private
        view
        returns (bool)
    {
        bytes32 digest = getVoucherDigest(channelId, ceiling);
        if (config.payerAuthorizer != address(0)) return _recoverOrRevert(digest, signature) == config.payerAuthorizer;
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
        if (!_isReceiverSide(msg.sender, config)) revert NotAuthorizedToRefund();
        _refund(config, amount);
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
        if (nonce != refundNonce[channelId]) revert InvalidRefundNonce();
        if (!_isValidSignatureNow(config.receiverAuthorizer, getRefundDigest(channelId, nonce, amount), receiverAuthorizerSignature)) {
            revert InvalidSignature();
        }
        _refund(config, amount);
    }

    /// Advances the refund nonce first, then returns min(amount, unclaimed escrow) to the payer. A
    /// pending withdrawal shrinks by the refunded amount (and is cancelled once fully covered).
    function _refund(ChannelConfig calldata config, uint128 amount) private {
        if (amount == 0) revert ZeroRefund();
        bytes32 channelId = getChannelId(config);
        refundNonce[channelId]++;
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
        emit Refunded(channelId, msg.sender, actual);
        if (ch.balance == 0 && ch.totalClaimed == 0) emit ChannelClosed(channelId, config);
        _safeTransfer(config.token, config.payer, actual);
    }

    // ---------------------------------------------------------------- timed withdrawal

    /// Starts the payer's timed withdrawal of up to the current unclaimed escrow.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (!_isPayerSide(msg.sender, config)) revert InvalidChannel();
        if (amount == 0) revert NothingToWithdraw();
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal storage pw = pendingWithdrawals[channelId];
        if (pw.initiatedAt != 0) revert WithdrawalAlreadyPending();
        ChannelState storage ch = channels[channelId];
        if (amount > ch.balance - ch.totalClaimed) revert WithdrawAmountExceedsAvailable();
        pw.amount = amount;
        pw.initiatedAt = uint40(block.timestamp);
        emit WithdrawInitiated(channelId, amount, uint40(block.timestamp) + config.withdrawDelay);
    }

    /// Completes a pending withdrawal once withdrawDelay has elapsed, capped to the unclaimed escrow
    /// left at that point (the receiver may have claimed in the meantime).
    function finalizeWithdraw(ChannelConfig calldata config) external nonReentrant {
        if (!_isPayerSide(msg.sender, config)) revert NotAuthorizedToFinalizeWithdraw();
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal memory pw = pendingWithdrawals[channelId];
        if (pw.initiatedAt == 0) revert WithdrawalNotPending();
        if (block.timestamp < uint256(pw.initiatedAt) + uint256(config.withdrawDelay)) revert WithdrawDelayNotElapsed();
        delete pendingWithdrawals[channelId];
        ChannelState storage ch = channels[channelId];
        uint128 available = ch.balance - ch.totalClaimed;
        uint128 amount = pw.amount < available ? pw.amount : available;
        ch.balance -= amount;
        emit WithdrawFinalized(channelId, msg.sender, amount);
        if (ch.balance == 0 && ch.totalClaimed == 0) emit ChannelClosed(channelId, config);
        if (amount > 0) _safeTransfer(config.token, config.payer, amount);
    }

    /// The payer, or its authorizer when one is set (a zero authorizer is nobody's address).
    function _isPayerSide(address sender, ChannelConfig calldata config) private pure returns (bool) {
        return sender == config.payer || sender == config.payerAuthorizer;
    }

    // ---------------------------------------------------------------- EIP-712 views

    function _domainSeparator() private view returns (bytes32) {
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
        return keccak256(abi.encodePacked("\x19\x01", _domainSeparator(), structHash));
    }
}
